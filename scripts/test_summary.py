"""The tally scripts/test.sh prints at its end: from the output it kept,
each test binary's (cargo's `Running` and `test result` lines) and each
pytest run's counts, then every skip with its reason. Rank bodies (tests
ignored as "rank body: ...", which only the tests that launch them run)
are counted apart from the ignored. Usage:
test_summary.py OUTPUT_LOG [SKIPS_LOG]"""

import re
import sys
from pathlib import Path


def main() -> None:
    log = Path(sys.argv[1])
    skips = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    if not log.exists():
        return
    rows, binary, pytest_label, bodies = [], None, None, 0
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"\s*(Running|Doc-tests) (\S+)", line)
        if m:
            binary = m[2] if m[1] == "Running" else f"doc-tests {m[2]}"
            bodies = 0
            continue
        if re.match(r"test \S+ \.\.\. ignored, rank body", line):
            bodies += 1
            continue
        m = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", line)
        if m and binary:
            rows.append((binary, int(m[1]), int(m[2]), int(m[3]) - bodies, 0, bodies))
            binary = None
            continue
        m = re.match(r"python-test: (.*)", line)
        if m:
            pytest_label = m[1]
            continue
        m = re.match(r"=* ?(.*\d+ (passed|failed|skipped|error).*) in [\d.]+s", line)
        if m and pytest_label:
            counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", m[1]))
            rows.append((f"pytest: {pytest_label}", counts.get("passed", 0),
                         counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
                         counts.get("deselected", 0), counts.get("skipped", 0), 0))
    print("\ntest.sh summary (ran = passed + failed; ignored, skipped; rank bodies, which run only "
          "inside the tests that launch them)", file=sys.stderr)
    total = [0, 0, 0, 0, 0]
    for name, passed, failed, ignored, skipped, ranks in rows:
        print(f"  {passed + failed:5} ran {failed:3} failed {ignored:4} ignored {skipped:3} skipped "
              f"{ranks:2} rank bodies  {name}", file=sys.stderr)
        for i, v in enumerate((passed, failed, ignored, skipped, ranks)):
            total[i] += v
    print(f"  total: {total[0] + total[1]} ran, {total[1]} failed, {total[2]} ignored, "
          f"{total[3]} skipped, {total[4]} rank bodies (pytest counts are per rank)", file=sys.stderr)
    if skips and skips.exists():
        lines = sorted(set(skips.read_text().splitlines()))
        print(f"  Rust tests that did not run ({len(lines)}):", file=sys.stderr)
        for l in lines:
            print(f"    {l}", file=sys.stderr)


if __name__ == "__main__":
    main()
