"""The desktop image: turngym's Debian base image plus an X desktop and real applications.

One layer on top of :func:`turngym.sandboxes.images.base_image`, built with
:func:`turngym.sandboxes.images.build_layer` (so it is cached by content hash like the swe-docker
images): Xvfb, the openbox window manager, ``xdotool``, ``xwd`` (screenshots), ``xclip``, a D-Bus
session bus and AT-SPI (``python3-pyatspi``), and the applications the ``gui-desktop`` tasks use —
mousepad (text editor), gnumeric (spreadsheet, with ``ssconvert``), pcmanfm (file manager), xterm
(terminal) and galculator (calculator). Packages come from the Debian mirror the base image was
made from, without recommends. The image has an unprivileged ``user`` (uid 1000) whose home the
desktop runs in; root inside the container is only used by the host (setup and checkers).
"""

from __future__ import annotations

from turngym.sandboxes.images import BuildReport, base_image, build_layer

DESKTOP_REPO = "turngym-desktop"
USER = "user"
UID = 1000
HOME = f"/home/{USER}"

#: Debian packages of the desktop layer (part of its content hash)
PACKAGES: tuple[str, ...] = (
    "xvfb",
    "x11-apps",
    "x11-utils",
    "x11-xserver-utils",
    "xdotool",
    "xclip",
    "openbox",
    "dbus-x11",
    "at-spi2-core",
    "libatk-adaptor",
    "python3-pyatspi",
    "gir1.2-atspi-2.0",
    "fonts-dejavu-core",
    "mousepad",
    "gnumeric",
    "pcmanfm",
    "xterm",
    "galculator",
)


def _commands() -> list[str]:
    pkgs = " ".join(PACKAGES)
    return [
        "apt-get update -q",
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {pkgs}",
        "apt-get clean && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*",
        f"useradd -m -u {UID} -s /bin/bash {USER}",
        "mkdir -p /etc/xdg/openbox && echo ok",
    ]


def desktop_image(base: str | None = None, *, force: bool = False) -> BuildReport:
    """Build (or find cached) the desktop image on ``base`` (default: turngym's Debian base image)."""
    parent = base_image(base)
    return build_layer(
        parent,
        DESKTOP_REPO,
        commands=_commands(),
        network=True,
        timeout=1800.0,
        labels={"turngym.image-kind": "desktop"},
        force=force,
    )
