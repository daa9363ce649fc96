"""Print one of the README's two opening commands: `main` or `test`.

Each follows an HTML comment marker (<!-- main-command --> or <!-- test-command -->) as the
first fenced code block after it. CI runs the test command through this script, so CI and the
README cannot drift apart.
"""

import re
import sys
from pathlib import Path

which = sys.argv[1] if len(sys.argv) > 1 else "test"
readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
match = re.search(rf"<!-- {which}-command -->\s*```[a-z]*\n(.*?)```", readme, re.S)
if not match:
    sys.exit(f"README.md has no fenced block after <!-- {which}-command -->")
print(match.group(1).strip())
