"""The documentation cannot drift: ``benchmarks/RESULTS.md`` is exactly what ``benchmarks.results_table`` renders from
``benchmarks/recorded/*.json``, every local link and anchor in the README and ``docs/`` resolves (into RESULTS.md: a
table's id), and the README stays a short user page with the test command CI runs (``.ci/run``) between its
markers."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import results_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL = ("python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints-cpu.txt -e '.[test]' "
           "&& pip install --no-deps mup")


def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_results_md_is_regenerated_identically_from_the_records():
    assert results_table.render(results_table.load()) == results_table.RESULTS.read_text(), (
        "benchmarks/RESULTS.md is stale: run python -m benchmarks.results_table")


def test_results_table_check_mode_agrees():
    done = subprocess.run([sys.executable, "-m", "benchmarks.results_table", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_record_has_provenance():
    for path in sorted(results_table.RECORDED.glob("*.json")):
        entry = json.loads(path.read_text())
        for key in ("command", "machine", "commit", "date", "load"):
            assert isinstance(entry[key], str) and entry[key].strip(), (path.name, key)
        assert entry["commit"] in ("unknown", "per row") or re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), path.name


def test_a_record_without_provenance_is_refused(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"benchmark": "b", "id": "x", "title": "t", "columns": ["a"],
                                                 "rows": [["1"]]}))
    with pytest.raises(ValueError, match="misses"):
        results_table.load(tmp_path)


def test_a_ragged_row_is_refused(tmp_path):
    entry = {key: "unknown" for key in results_table.REQUIRED}
    entry.update(benchmark="b", id="x", columns=["a", "b"], rows=[["1"]])
    (tmp_path / "x.json").write_text(json.dumps(entry))
    with pytest.raises(ValueError, match="rows of another length"):
        results_table.load(tmp_path)


def test_readme_is_short_and_holds_the_ci_test_command_between_its_markers():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the limit is 250 (move details to docs/)"
    start, end = lines.index("<!-- tests -->"), lines.index("<!-- /tests -->")
    commands = [line for line in lines[start + 1:end] if line and not line.startswith(("<!--", "```"))]
    assert commands == [f"{INSTALL} && python -m pytest -q"], commands
    assert f"{INSTALL} && hydro tune --example digits-mlp --samples 64 --scale 8" in lines


def test_constraints_file_pins_the_cpu_torch():
    assert (ROOT / "constraints-cpu.txt").read_text() == "torch==2.13.0\n"


def _anchors(page: Path) -> set[str]:
    """The anchors of a markdown page: its ``<a id>`` tags and its headings' GitHub slugs."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return (set(re.findall(r'<a id="([^"]+)"></a>', text))
            | {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings})


def test_links_into_results_name_a_table_and_local_links_resolve():
    assert re.search(r'<a id="', results_table.RESULTS.read_text()), "RESULTS.md has no table anchors"
    for doc in _docs():
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            assert resolved.exists(), f"{doc.relative_to(ROOT)} links to missing {target}"
            if anchor and resolved.suffix == ".md":
                assert anchor in _anchors(resolved), f"{doc.relative_to(ROOT)} links to unknown anchor {target}"


def test_a_per_row_commit_needs_a_commit_column(tmp_path):
    entry = {key: "unknown" for key in results_table.REQUIRED}
    entry.update(benchmark="b", id="x", commit="per row", columns=["a"], rows=[["1"]])
    (tmp_path / "x.json").write_text(json.dumps(entry))
    with pytest.raises(ValueError, match="no 'commit' column"):
        results_table.load(tmp_path)
