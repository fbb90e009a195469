"""A harness of the standard library alone (so 64 of them start fast): ``CALLS`` chat calls that keep
their history, then the reward 1.0 posted for its episode. Reads ``OPENAI_BASE_URL``/``OPENAI_API_KEY``
as the ``openai`` SDK does.

    python counting_harness.py CALLS
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main() -> None:
    base, calls = os.environ["OPENAI_BASE_URL"], int(sys.argv[1])
    messages = [{"role": "user", "content": f"Episode {os.environ['TURNGYM_EPISODE']}: count."}]
    for _ in range(calls):
        reply = post(f"{base}/chat/completions", {"model": "m", "messages": messages})
        messages += [reply["choices"][0]["message"], {"role": "user", "content": "more"}]
    post(f"{base}/reward", {"reward": 1.0})


if __name__ == "__main__":
    main()
