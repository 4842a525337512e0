"""report.md as HTML: the subset of markdown the report writes (headings, paragraphs, pipe tables,
bullet lists, images, code spans), so report.html holds exactly what report.md holds, in one
self-contained file (figures inlined) that the Snakemake report shows on its main page."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

HTML_NAME = "report.html"


HTML_STYLE = (
    ".plantbench-report table{border-collapse:collapse;margin:0.5em 0;font-size:0.85em}"
    ".plantbench-report th,.plantbench-report td{border:1px solid #ccc;padding:2px 6px;"
    "text-align:left;vertical-align:top}"
    ".plantbench-report .table{overflow-x:auto}"
    ".plantbench-report img{max-width:100%;height:auto}"
)


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str) -> str:
    return _CODE.sub(r"<code>\1</code>", html.escape(text, quote=False))


def _cells(line: str, tag: str) -> str:
    cells = line.strip().removeprefix("|").removesuffix("|").split("|")
    return "<tr>" + "".join(f"<{tag}>{_inline(c.strip())}</{tag}>" for c in cells) + "</tr>"


def _table_html(lines: list[str]) -> str:
    body = [_cells(x, "td") for x in lines[2:]]
    return (
        f'<div class="table"><table><thead>{_cells(lines[0], "th")}</thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _image_html(alt: str, src: str, folder: Path) -> str:
    data = base64.b64encode((folder / src).read_bytes()).decode()
    alt = html.escape(alt)
    return f'<figure><img src="data:image/png;base64,{data}" alt="{alt}" title="{alt}"></figure>'


def _block_html(lines: list[str], folder: Path) -> str:
    first = lines[0]
    heading = re.match(r"(#{1,6}) (.*)", first)
    if heading and len(lines) == 1:
        n = len(heading.group(1))
        return f"<h{n}>{_inline(heading.group(2))}</h{n}>"
    if first.startswith("|") and len(lines) > 1 and set(lines[1]) <= set("|-: "):
        return _table_html(lines)
    image = _IMAGE.fullmatch(first.strip())
    if image and len(lines) == 1:
        return _image_html(image.group(1), image.group(2), folder)
    if all(x.startswith("- ") for x in lines):
        return "<ul>" + "".join(f"<li>{_inline(x[2:])}</li>" for x in lines) + "</ul>"
    return f"<p>{_inline(' '.join(lines))}</p>"


def _blocks(md: str) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in md.splitlines():
        if not line.strip():
            blocks.append([])
        elif re.match(r"#{1,6} ", line):
            blocks += [[line], []]
        else:
            blocks[-1].append(line)
    return [b for b in blocks if b]


def markdown_html(md: str, folder: Path) -> str:
    """report.md as a standalone HTML document; images (relative to ``folder``) are inlined."""
    body = "\n".join(_block_html(b, folder) for b in _blocks(md))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>plantbench study report</title>\n<style>{HTML_STYLE}</style>\n</head>\n"
        f'<body>\n<div class="plantbench-report">\n{body}\n</div>\n</body>\n</html>\n'
    )
