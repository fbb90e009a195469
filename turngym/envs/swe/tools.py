"""The agent's tools in ``swe-docker``: ``bash``, ``file_editor`` (view / create / str_replace / insert /
undo_edit), ``search`` and the terminal ``submit``, with the editor's file I/O in the container.

``SweTools`` is a mixin for :class:`~turngym.envs.swe.env.SweDockerEnv`, which holds the sandbox
(``_sb``, ``_exec``, ``_sandbox_call``), the task (``_swe``) and the episode's edit records
(``_edited``, ``_history``, ``_flags``) that these tools read and write.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import TYPE_CHECKING, Literal

from turngym.envs.swe import editor
from turngym.envs.swe.packages import REPO_DIR
from turngym.tools import ToolError, tool

if TYPE_CHECKING:
    from turngym.envs.swe.tasks import SweTask

#: a bash command that runs tests (the ``tests_run`` reward component)
TEST_COMMAND = re.compile(r"\b(pytest|py\.test|unittest|tox|nox)\b|\bpython3?\s+\S*test\S*\.py")


class SweTools:
    """The tools of a ``swe-docker`` episode (see the module doc)."""

    # ------------------------------------------------------------ tools
    @tool
    async def bash(self, command: str) -> str:
        """Run a bash command in the repository's container (cwd /testbed, no network).

        Each call is a fresh shell; commands that run too long are killed (the container stays).

        Args:
            command: the bash command to run
        """
        if not command.strip():
            raise ToolError("empty command")
        res = await self._exec(command)
        if TEST_COMMAND.search(command):
            self._flags["tests_run"] = 1.0
        if self._swe is not None and command == gold_command(self._swe):
            self._gold_tried = True  # the expert submits next (a patch that does not apply then fails)
        text = f"<returncode>{res.exit_code}</returncode>\n<output>\n{res.output}</output>"
        if res.timed_out:
            text += (
                f"\n<warning>The command ran longer than {self.command_timeout:g}s and was killed; "
                "the container is still usable. Run long jobs with a smaller scope.</warning>"
            )
        elif res.truncated:
            text += (
                "\n<warning>The output was too long and was cut in the middle; use head, tail, grep "
                "or a narrower command.</warning>"
            )
        return text

    @tool
    async def file_editor(
        self,
        command: Literal["view", "create", "str_replace", "insert", "undo_edit"],
        path: str,
        file_text: str | None = None,
        view_range: list[int] | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
    ) -> str:
        """View, create and edit files. Paths are absolute (e.g. /testbed/pkg/mod.py).

        `view` shows a file with line numbers (optionally `view_range` [start, end], end -1 = to the
        end) or lists a directory two levels deep. `create` writes a new file with `file_text`.
        `str_replace` replaces the single exact occurrence of `old_str` with `new_str`. `insert` adds
        `new_str` after line `insert_line` (0 = top). `undo_edit` reverts the last edit of the file.

        Args:
            command: the operation
            path: absolute path of the file or directory
            file_text: content of the new file (create)
            view_range: [start, end] line range to show (view)
            old_str: exact text to replace (str_replace)
            new_str: replacement (str_replace) or text to insert (insert)
            insert_line: line after which to insert (insert)
        """
        resolved = await self._resolve(path)
        try:
            if command == "view":
                return await self._view(resolved, view_range)
            self._check_writable(resolved)
            if command == "create":
                if file_text is None:
                    raise ToolError("create needs file_text")
                if await self._exists(resolved):
                    raise ToolError(f"{resolved} already exists; use str_replace to edit it")
                await self._write(resolved, file_text, previous=None)
                return f"File created successfully at: {resolved}"
            if command == "undo_edit":
                history = self._history.get(resolved)
                if not history:
                    raise ToolError(f"no edit of {resolved} to undo")
                previous = history.pop()
                if previous is None:
                    await self._exec(f"rm -f -- {shlex.quote(resolved)}")
                    self._edited.pop(resolved, None)
                else:
                    await self._put(resolved, previous)
                self._flags["edit_applied"] = 1.0
                return f"Last edit to {resolved} undone successfully."
            text = await self._read_text(resolved)
            if command == "str_replace":
                if old_str is None:
                    raise ToolError("str_replace needs old_str")
                new_text, message = editor.str_replace(text, old_str, new_str or "", resolved)
                self._note_expert_edit(resolved, old_str, new_str or "")
            else:  # insert
                if insert_line is None or new_str is None:
                    raise ToolError("insert needs insert_line and new_str")
                new_text, message = editor.insert(text, insert_line, new_str, resolved)
            await self._write(resolved, new_text, previous=text)
            return message
        except editor.EditError as e:
            raise ToolError(str(e)) from e

    @tool
    async def search(self, search_term: str, path: str = REPO_DIR) -> str:
        """Search for a literal string in a file or, recursively, in a directory (skipping .git).

        Args:
            search_term: the text to look for
            path: file or directory to search (default /testbed)
        """
        if not search_term:
            raise ToolError("search_term must not be empty")
        resolved = await self._resolve(path)
        term, where = shlex.quote(search_term), shlex.quote(resolved)
        res = await self._exec(
            f"if [ -d {where} ]; then grep -rIcF --exclude-dir=.git -- {term} {where} | grep -v ':0$'; "
            f"elif [ -f {where} ]; then grep -nF -- {term} {where}; else echo 'no such path: {resolved}'; exit 2; fi"
        )
        if res.exit_code == 2:
            raise ToolError(res.output.strip())
        lines = [line for line in res.output.splitlines() if line.strip()]
        if not lines:
            return f'No matches found for "{search_term}" in {resolved}'
        if await self._is_dir(resolved):
            if len(lines) > 100:
                return (
                    f'More than {len(lines) - 1} files matched "{search_term}" in {resolved}; narrow it down.'
                )
            counts = [line.rsplit(":", 1) for line in lines]
            total = sum(int(c) for _, c in counts if c.isdigit())
            body = "\n".join(f"{f} ({c} matches)" for f, c in counts)
            return f'Found {total} matches for "{search_term}" in {resolved}:\n{body}'
        return f'Matches for "{search_term}" in {resolved}:\n' + "\n".join(lines)

    @tool(terminal=True)
    async def submit(self) -> str:
        """Submit the current state of the repository as the fix; ends the episode."""
        from turngym.envs.swe.repo import changed_paths, current_patch, gradable_patch

        task = self._swe
        assert task is not None
        patch = await self._sandbox_call(current_patch, self._sb)
        if task.harbor is not None:  # its tests live outside the repository: every change counts
            self._patch, dropped = patch, []
        else:
            self._patch, dropped = gradable_patch(patch, task.is_test_path, task.files())
        self._submitted = True
        files = changed_paths(self._patch)
        note = (
            f" Changes to test or test-runner files were dropped: {', '.join(sorted(dropped))}."
            if dropped
            else ""
        )
        return f"Submitted a patch that changes {len(files)} file(s): {', '.join(files) or '(none)'}.{note}"

    # ------------------------------------------------------------ editor I/O
    async def _resolve(self, path: str) -> str:
        if not path.startswith("/"):
            raise ToolError(f"path must be absolute (e.g. {REPO_DIR}/...), got {path!r}")
        res = await self._exec(f"realpath -m -- {shlex.quote(path)}", timeout=30)
        if res.exit_code != 0:
            raise ToolError(f"cannot resolve {path!r}: {res.output.strip()}")
        return res.output.strip()

    def _check_writable(self, resolved: str) -> None:
        inside = resolved == REPO_DIR or resolved.startswith(REPO_DIR + "/")
        if not inside or resolved.startswith(f"{REPO_DIR}/.git/") or resolved == f"{REPO_DIR}/.git":
            raise ToolError(
                f"editing outside the repository is not allowed: {resolved} (edit files under {REPO_DIR})"
            )

    async def _exists(self, path: str) -> bool:
        return (await self._exec(f"test -e {shlex.quote(path)}", timeout=30)).exit_code == 0

    async def _is_dir(self, path: str) -> bool:
        return (await self._exec(f"test -d {shlex.quote(path)}", timeout=30)).exit_code == 0

    async def _view(self, path: str, view_range: list[int] | None) -> str:
        if await self._is_dir(path):
            res = await self._exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' -not -name '__pycache__' | sort",
                timeout=30,
            )
            return f"Here are the files and directories up to 2 levels deep in {path}:\n{res.output}"
        return editor.view(await self._read_text(path), path, view_range)

    async def _read_text(self, path: str) -> str:
        data = await self._sandbox_call(self._sb.get_file, path, max_bytes=2 << 20)
        if b"\x00" in data:
            raise ToolError(f"{path} is a binary file; the editor only handles text")
        return data.decode("utf-8", errors="replace")

    async def _put(self, path: str, text: str) -> None:
        await self._sandbox_call(self._sb.put_files, {path: text.encode()})
        self._edited[path] = hashlib.sha1(text.encode()).hexdigest()[:12]

    async def _write(self, path: str, text: str, previous: str | None) -> None:
        await self._put(path, text)
        self._history.setdefault(path, []).append(previous)
        self._flags["edit_applied"] = 1.0


def gold_command(task: SweTask) -> str | None:
    """The bash command of a loaded task's reference solution: ``git apply`` of its gold patch, or a
    Harbor task's ``solution/solve.sh`` run in its working directory; None when it has neither."""
    if task.harbor is not None:
        script = task.harbor.get("solution")
        if not script:
            return None
        end = "TURNGYM_SOLVE_EOF"
        while end in script:
            end += "_"
        body = script if script.endswith("\n") else script + "\n"
        return f"cd {shlex.quote(task.harbor['workdir'])} && bash -s <<'{end}'\n{body}{end}"
    return apply_command(task.patch) if task.patch.strip() else None


def apply_command(patch: str) -> str:
    """A bash command that applies ``patch`` to the repository (a here-document, so it stays readable)."""
    end = "TURNGYM_PATCH_EOF"
    while end in patch:
        end += "_"
    body = patch if patch.endswith("\n") else patch + "\n"
    return f"git apply --binary --whitespace=nowarn - <<'{end}'\n{body}{end}"
