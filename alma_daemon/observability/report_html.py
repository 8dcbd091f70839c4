"""One self-contained HTML page for ``alma report DIR --html``, for people who do not run Grafana.

Pure rendering: the caller (:func:`alma_daemon.observability.report.write_report`) gives the table and the PNG
bytes; the plots are inlined as base64 ``data:`` URIs, so the page is a single file that can be
mailed or attached to a ticket, and it loads nothing from the network.
"""

from __future__ import annotations

import base64
import html
import time

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; white-space: nowrap; }
th { background: #f3f3f3; }
figure { margin: 1.5em 0; }
figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; }
"""


def html_page(
    title: str,
    header: list[str],
    rows: list[list[str]],
    images: list[tuple[str, bytes]],
    notes: list[str] | None = None,
    *,
    tables: list[tuple[str, list[str], list[list[str]], list[str]]] | None = None,
) -> str:
    """The report page: a title, the summary table (one row per run), ``notes`` (a paragraph each),
    ``tables`` (each a heading, its header and rows, and paragraphs after it: the policies'), then
    each captioned PNG."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    text = "".join(f"<p>{html.escape(note)}</p>\n" for note in notes or [])
    for heading, table_header, table_rows, after in tables or []:
        text += f"<h2>{html.escape(heading)}</h2>\n{_table(table_header, table_rows)}\n"
        text += "".join(f"<p>{html.escape(line)}</p>\n" for line in after)
    figures = "\n".join(
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{html.escape(caption)}</figcaption></figure>'
        for caption, png in images
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>Generated {html.escape(when)}. A running stream's results are read as they were at that moment.</p>
{_table(header, rows)}
{text}{figures}
</body>
</html>
"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head_cells = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body_rows = "\n".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{head_cells}</tr></thead>\n<tbody>\n{body_rows}\n</tbody>\n</table>"
