"""What every self-contained HTML page of the project shares: the style sheet and images as data URIs
(the score stage's report, the index stage's page, ``recallk report``). Nothing else, so the index stage
depends on this file alone of the report's rendering."""

from __future__ import annotations

import base64
import io

from PIL import Image

STYLE = ("body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;"
         "margin:1em 0}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}td:first-child,"
         "th:first-child{text-align:left}h1{font-size:20px}h2{font-size:16px;margin-top:2em}"
         "dt{font-weight:600;float:left;width:11em}dd{margin-left:12em}")


def png_data_uri(image: Image.Image) -> str:
    """``image`` as a ``data:image/png;base64,...`` URI (an ``<img src>`` that fetches nothing)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
