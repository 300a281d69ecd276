#!/bin/bash
# Checker of the dev items asking for a `calc` command (AgentBench's check/0.sh is not vendored; this is an
# equivalent written for this project): `calc EXPR` must print EXPR's value within 1e-5 for every case.
cases=(
  "15 + (27 * 4) - 10" "8 * (14 - 6) + 12" "3 + (6.7 * 9) - 5.5" "20 / (5 + 2) - 1"
  "9 * (16 / 8) + 3" "25 - (8 * 3) + 2" "14 + (25.6 / 2) - 5.2" "18 / (6 - 2) + 9"
  "36 / (6 - 3) + 10" "50 / (5 + 2) - 6" "21 - (9 * 2) + 4" "2 * (9 / 3)"
)
for expr in "${cases[@]}"; do
  got=$(calc "$expr" 2>/dev/null) || exit 1
  python3 - "$expr" "$got" <<'PY' || exit 1
import sys
expr, got = sys.argv[1], sys.argv[2]
try:
    ok = abs(float(got.strip()) - eval(expr, {"__builtins__": {}})) < 1e-5
except ValueError:
    ok = False
sys.exit(0 if ok else 1)
PY
done
exit 0
