"""Credit audit: ground-truth turn advantages from forked envs, and every credit method scored on them.

    from turngym.trainer.audit import AuditConfig, run_audit, write_audit
    result = await run_audit(agent, AuditConfig(env="search-qa", n=32, k=8))
    write_audit("runs/audit", result.report, result.trajectories)

``run`` samples the trajectories with forked value estimates and scores the methods, ``stats`` holds
the correlations and the cluster bootstrap, ``report`` writes JSON, markdown and trajectories, and
``commands`` is ``turngym credit audit``. How to read the table: docs/credit.md ("Credit audit").
"""

from turngym.trainer.audit.report import markdown_table, write_audit
from turngym.trainer.audit.run import DEFAULT_METHODS, AuditConfig, AuditResult, parse_method, run_audit

__all__ = [
    "DEFAULT_METHODS",
    "AuditConfig",
    "AuditResult",
    "markdown_table",
    "parse_method",
    "run_audit",
    "write_audit",
]
