"""What a ``swe-docker`` agent is told: the system prompt and the user prompts of synthesised or loaded
tasks and of Harbor tasks (formatted by :class:`~turngym.envs.swe.env.SweDockerEnv` at reset)."""

SYSTEM_PROMPT = """You are an autonomous software engineer working in a sandboxed Linux container.
A Python repository is checked out at /testbed (it is the current directory; there is no network).
Resolve the issue the user describes by editing the repository's non-test source files.
Explore the code, reproduce the problem, make a minimal fix, check it with the tests, then call submit.
Test files are restored to their original state before grading, so changing them does not help."""

USER_PROMPT = """<uploaded_files>
{repo_dir}
</uploaded_files>
I've uploaded a python code repository in the directory {repo_dir}. Consider the following issue:

<issue>
{issue}
</issue>

Make the minimal changes to non-test files in {repo_dir} so that the issue is resolved.
Run the tests with `python3 -m pytest -q <path>`; when you are done, call submit."""

HARBOR_USER_PROMPT = """{instruction}

(You work in {workdir} in a sandboxed Linux container with no network; it is the same directory as
{repo_dir}. Only changes under {workdir} count. When you are done, call submit.)"""
