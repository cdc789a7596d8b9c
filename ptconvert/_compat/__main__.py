"""``python -m ptconvert._compat``: each hook's status (name, what it touches, the versions it
was tested on, the installed ones, the probe, the fallback); exit 1 when a probe without a
fallback fails (the feature that hook serves cannot work with these versions)."""

from __future__ import annotations

import sys

from ptconvert._compat import status


def main() -> int:
    rows = status()
    failed = 0
    for row in rows:
        print(f"{row['name']}: probe {row['probe']} ({row['kind']})")
        print(f"  what:      {row['what']}")
        print(f"  tested:    {row['tested']}; installed: {row['installed']}")
        print(f"  on a failed probe: {row['fallback']}")
        failed += row["probe"] == "FAILED" and row["fallback"].startswith("none")
    ok = sum(row["probe"] == "OK" for row in rows)
    print(f"{ok} of {len(rows)} hooks' probes pass; {failed} failed without a fallback")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
