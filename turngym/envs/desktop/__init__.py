"""``gui-desktop``: real desktop applications under X in Docker (env, tasks, checkers, expert, fork)."""
