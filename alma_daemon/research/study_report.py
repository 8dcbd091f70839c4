"""The study's report: the verdicts first, then each experiment's table and figures.

``report.md`` links the PNGs under ``figures/``; ``report.html`` is one self-contained page with the
same figures inlined. The figures are :mod:`alma_daemon.observability.report`'s, drawn per experiment.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alma_daemon.observability.report import PLOTS, Run, draw_plots, find_runs, left_out, markdown_table
from alma_daemon.observability.report_html import html_page

if TYPE_CHECKING:
    from alma_daemon.research.study import Scale


def _key_numbers(finding: dict[str, Any]) -> str:
    """The evidence a reader checks first: how many seeds held, and what was missing."""
    evidence = finding.get("evidence", {})
    parts = [f"{evidence['seeds_holding']} seeds hold"] if "seeds_holding" in evidence else []
    if evidence.get("missing"):
        parts.append(f"missing: {evidence['missing']}")
    return "; ".join(parts)


def _figures(runs: list[Run], folder: Path, prefix: str) -> list[tuple[str, str]]:
    """Draw one experiment's figures; return (file name under ``folder``, caption)."""
    folder.mkdir(parents=True, exist_ok=True)
    captions = {PLOTS[0][1]: f"{PLOTS[0][1]} (mean over seeds)"}
    return [(name, f"{prefix}: {captions.get(c, c)}") for name, c in draw_plots(runs, folder, f"{prefix}-")]


def write_study_report(
    out: Path,
    experiments: list[Any],
    findings: list[dict[str, Any]],
    scale: Scale,
    seeds: int,
    judged: list[int] | None = None,
) -> Path:
    """Write ``report.md``, ``report.html`` and ``figures/*.png`` for a study in ``out``.

    ``judged`` are the seeds the verdicts rest on (all ``seeds`` when None); fewer are said under the
    title, as the tables below still show every finished run."""
    title = f"ALMA study: the paper's findings (scale {scale.name}, {seeds} seed(s))"
    md = [f"# {title}", ""]
    if judged is not None and len(judged) < seeds:
        on = f"seed(s) {judged} only" if judged else "no seed"
        md += [f"Verdicts judged on {on}: the other seeds have runs missing.", ""]
    md += ["| finding | claim | verdict | evidence |", "|---|---|---|---|"]
    rows = []
    for f in findings:
        md.append(f"| {f['id']} | {f['claim']} | **{f['verdict']}** | {_key_numbers(f)} |")
        rows.append([f["id"], f["claim"], f["verdict"], _key_numbers(f)])
    md += ["", "Rules and per-seed numbers: `findings.json`.", ""]
    for f in findings:
        md += [f"- **{f['id']}** ({f['verdict']}): {f['rule']}"]
    images: list[tuple[str, bytes]] = []
    for experiment in experiments:
        root = out / "runs" / experiment.name
        try:
            runs = find_runs(root)
        except FileNotFoundError:
            continue
        md += ["", f"## {experiment.name}", "", experiment.what, "", markdown_table(runs)]
        drawn = _figures(runs, out / "figures", experiment.name)
        md += [f"{note}\n" for note in left_out(drawn, f"{experiment.name}-")]
        md += [f"![{caption}](figures/{name})\n" for name, caption in drawn]
        images += [(caption, (out / "figures" / name).read_bytes()) for name, caption in drawn]
    (out / "report.md").write_text("\n".join(md) + "\n")
    rules = "".join(f"<li><b>{html.escape(f['id'])}</b>: {html.escape(f['rule'])}</li>" for f in findings)
    page = html_page(title, ["finding", "claim", "verdict", "evidence"], rows, images)
    page = page.replace("</table>", f"</table>\n<h2>Rules</h2><ul>{rules}</ul>\n<h2>Experiments</h2>", 1)
    (out / "report.html").write_text(page)
    return out / "report.html"
