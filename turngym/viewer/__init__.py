"""Static HTML trajectory report: ``turngym view RUN_DIR``."""

from turngym.viewer.report import build_report, write_report

__all__ = ["build_report", "write_report"]
