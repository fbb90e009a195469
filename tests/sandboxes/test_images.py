"""Images: mirror discovery, content-hash caching of the base image and of layers; the CLI commands."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from turngym.sandboxes.images import BaseRecipe, apt_mirror


def test_apt_mirror_reads_deb822_and_one_line_formats(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\n"
    )
    assert apt_mirror(str(tmp_path)) == "http://mirror.example/debian"
    other = tmp_path / "old"
    other.mkdir()
    (other / "sources.list").write_text("# c\ndeb [arch=amd64] http://m.example/debian bookworm main\n")
    assert apt_mirror(str(other)) == "http://m.example/debian"
    with pytest.raises(Exception, match="no Debian mirror"):
        apt_mirror(str(tmp_path / "missing"))


def test_recipe_hash_depends_on_content_only():
    a = BaseRecipe(packages=("python3", "git"))
    b = BaseRecipe(packages=("git", "python3"))
    c = BaseRecipe(packages=("python3", "git", "curl"))
    assert a.tag == b.tag != c.tag


@pytest.mark.docker
@pytest.mark.slow
def test_base_and_layers_are_cached(base_image):
    from turngym.sandboxes.images import build_base_image, build_layer

    again = build_base_image()
    assert again.cached and again.tag == base_image
    first = build_layer(
        base_image, "turngym-test", files={"/opt/x.txt": "v1"}, commands=["test -f /opt/x.txt"]
    )
    second = build_layer(
        base_image, "turngym-test", files={"/opt/x.txt": "v1"}, commands=["test -f /opt/x.txt"]
    )
    changed = build_layer(
        base_image, "turngym-test", files={"/opt/x.txt": "v2"}, commands=["test -f /opt/x.txt"]
    )
    assert second.cached and second.tag == first.tag and changed.tag != first.tag
    from turngym.sandboxes.docker import DockerSandbox

    with DockerSandbox.create(changed.tag) as sb:
        assert sb.get_file("/opt/x.txt") == b"v2"
        assert sb.exec("python3 -c 'import pytest' && git --version").exit_code == 0


@pytest.mark.docker
@pytest.mark.slow
def test_failing_build_step_is_reported(base_image):
    from turngym.sandboxes.docker import SandboxError, managed_containers
    from turngym.sandboxes.images import build_layer

    with pytest.raises(SandboxError, match="build step failed"):
        build_layer(base_image, "turngym-test", commands=["echo nope; exit 7"])
    assert managed_containers(run_id="image-build") == []


@pytest.mark.docker
@pytest.mark.slow
def test_cli_ls_and_prune(base_image):
    from turngym.sandboxes.commands import sandbox_ls, sandbox_prune
    from turngym.sandboxes.docker import DockerSandbox

    app = typer.Typer()
    app.command("ls")(sandbox_ls)
    app.command("prune")(sandbox_prune)
    runner = CliRunner()
    with DockerSandbox.create(base_image, run_id="t-cli") as sb:
        out = runner.invoke(app, ["ls"], terminal_width=200)
        assert out.exit_code == 0 and sb.name in out.output
        out = runner.invoke(app, ["prune"])  # the owner (this process) is alive: kept
        assert out.exit_code == 0 and sb.alive()
        out = runner.invoke(app, ["prune", "--all", "--run-id", "t-cli"])
        assert out.exit_code == 0 and sb.name in out.output and not sb.alive()


@pytest.mark.docker
@pytest.mark.slow
def test_networked_build_reaches_the_package_index_with_the_host_ca(base_image):
    from turngym.sandboxes.docker import DockerSandbox
    from turngym.sandboxes.images import CONTAINER_CA_PATH, build_layer

    rep = build_layer(
        base_image,
        "turngym-test",
        commands=["python3 -m pip download -q --no-deps --only-binary :all: -d /opt/dl six==1.17.0"],
        network=True,
    )
    with DockerSandbox.create(rep.tag) as sb:
        assert sb.exec("ls /opt/dl").output.strip() == "six-1.17.0-py2.py3-none-any.whl"
        assert sb.exec(f"test -e {CONTAINER_CA_PATH}").exit_code == 1  # the host CA is not baked in
        assert (
            sb.exec("python3 -c 'import socket; socket.create_connection((\"pypi.org\", 443), 3)'").exit_code
            != 0
        )


@pytest.mark.docker
@pytest.mark.slow
def test_an_existing_base_image_can_be_named(base_image, monkeypatch):
    from turngym.sandboxes.docker import SandboxError
    from turngym.sandboxes.images import base_image as resolve

    assert resolve(base_image) == base_image
    monkeypatch.setenv("TURNGYM_BASE_IMAGE", base_image)
    assert resolve() == base_image
    with pytest.raises(SandboxError, match="does not exist"):
        resolve("registry.example/nope:1")
