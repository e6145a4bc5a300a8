"""``/docs`` of ``lmforge serve`` without internet: Swagger UI from files the app serves itself, or a plain page.

FastAPI's own ``/docs`` page loads Swagger UI from a CDN, so on a machine without internet (a common place to serve
a model) it renders blank. Here:

- when the ``swagger-ui-bundle`` package is installed (it comes with ``pip install 'lmforge[serve]'``), its files are
  served under ``/docs/assets/`` and ``/docs`` is a Swagger UI page that loads only those and ``/openapi.json``;
- otherwise ``/docs`` is one self-contained HTML page written from the OpenAPI schema: every endpoint with its
  request fields (type, limits, default, description) and its answer's fields.

The Swagger UI that package ships (4.x) reads OpenAPI 3.0, while FastAPI writes 3.1: the page reads the same schema
rewritten into 3.0 (``/docs/openapi-3.0.json``: ``anyOf [X, null]`` becomes ``nullable``, numeric exclusive bounds
become boolean ones); ``/openapi.json`` stays FastAPI's own.

Neither page names any other host: no CDN, no font, no online validator (Swagger UI's validator badge, which calls
validator.swagger.io, is switched off). ReDoc (``/redoc``, another CDN page) is not served.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

ASSETS_PATH = "/docs/assets"
OPENAPI_30_PATH = "/docs/openapi-3.0.json"
_NEEDED = ("swagger-ui-bundle.js", "swagger-ui.css")


def swagger_assets() -> Path | None:
    """The folder of Swagger UI's files from the ``swagger-ui-bundle`` package, or None when it is not installed
    (or lacks a file the page needs)."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    folder = Path(str(swagger_ui_path))
    return folder if all((folder / name).is_file() for name in _NEEDED) else None


def add_docs(app: Any, assets: Path | None) -> None:
    """Serve ``/docs`` on ``app`` (created with ``docs_url=None, redoc_url=None``): Swagger UI from ``assets``, or
    the self-contained page when ``assets`` is None."""
    from fastapi.responses import HTMLResponse

    if assets is not None:
        from fastapi.staticfiles import StaticFiles

        app.mount(ASSETS_PATH, StaticFiles(directory=assets), name="docs-assets")
        page = swagger_page(app.title, OPENAPI_30_PATH)

        @app.get("/docs", include_in_schema=False)
        async def swagger_docs() -> HTMLResponse:
            return HTMLResponse(page)

        @app.get(OPENAPI_30_PATH, include_in_schema=False)
        async def openapi_30() -> dict[str, Any]:
            return as_openapi_30(app.openapi())
        return

    @app.get("/docs", include_in_schema=False)
    async def plain_docs() -> HTMLResponse:
        return HTMLResponse(schema_page(app.openapi()))


def swagger_page(title: str, openapi_url: str) -> str:
    """Swagger UI's page, loading its script and style from ``/docs/assets`` and the schema from ``openapi_url``."""
    config = {"url": openapi_url, "dom_id": "#swagger-ui", "deepLinking": True, "layout": "BaseLayout",
              "validatorUrl": None, "defaultModelsExpandDepth": 2, "defaultModelExpandDepth": 3,
              "docExpansion": "list", "tryItOutEnabled": True}
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - API docs</title>
<link rel="stylesheet" href="{ASSETS_PATH}/swagger-ui.css">
<link rel="icon" type="image/png" href="{ASSETS_PATH}/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{ASSETS_PATH}/swagger-ui-bundle.js"></script>
<script>
const config = {json.dumps(config)};
config.presets = [SwaggerUIBundle.presets.apis];
window.ui = SwaggerUIBundle(config);
</script>
</body>
</html>
"""


def as_openapi_30(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI 3.1 document in OpenAPI 3.0's dialect, for Swagger UI 4 (which refuses 3.1).

    Only what FastAPI writes needs rewriting: ``anyOf`` with ``{"type": "null"}`` -> ``nullable: true`` (a lone
    ``$ref`` goes under ``allOf``, since 3.0 ignores keys beside a ``$ref``), numeric ``exclusiveMinimum`` /
    ``exclusiveMaximum`` -> ``minimum`` / ``maximum`` with a boolean flag, ``const`` -> a one-value ``enum``,
    ``examples`` (a list) -> ``example`` (its first).
    """
    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {k: convert(v) for k, v in node.items()}
        options = out.get("anyOf")
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            del out["anyOf"]
            if len(rest) == 1 and "$ref" in rest[0]:
                out["allOf"] = rest
            elif len(rest) == 1:
                out = {**rest[0], **out}
            else:
                out["anyOf"] = rest
            out["nullable"] = True
        for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(out.get(key), (int, float)) and not isinstance(out.get(key), bool):
                out[bound], out[key] = out[key], True
        if "const" in out:
            out["enum"] = [out.pop("const")]
        if isinstance(out.get("examples"), list) and "paths" not in out:
            examples = out.pop("examples")
            if examples:
                out["example"] = examples[0]
        return out

    converted = convert(schema)
    converted["openapi"] = "3.0.3"
    return converted


# ------------------------------------------------------------------------------------ the self-contained page
_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
code, .method { font-family: ui-monospace, monospace; }
.method { display: inline-block; min-width: 4em; padding: 0 .4em; border-radius: 3px; color: #fff;
          background: #49cc90; text-align: center; } .get { background: #61affe; }
table { border-collapse: collapse; width: 100%; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } .note { color: #555; }
"""


def schema_page(openapi: dict[str, Any]) -> str:
    """One HTML page (no script, no outside resource) describing every endpoint of the OpenAPI schema ``openapi``:
    method, path, summary, the request body's fields and the answer's fields."""
    info = openapi.get("info", {})
    components = openapi.get("components", {}).get("schemas", {})
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
             f"<title>{html.escape(str(info.get('title', 'API')))} - API docs</title>\n<style>{_STYLE}</style>\n"
             f"</head>\n<body>\n<h1>{html.escape(str(info.get('title', 'API')))} "
             f"<small>{html.escape(str(info.get('version', '')))}</small></h1>\n"
             f"<p>{html.escape(str(info.get('description', '')))}</p>\n"
             "<p class=\"note\">The machine-readable schema is <a href=\"/openapi.json\">/openapi.json</a>. "
             "Requests are JSON bodies sent with <code>Content-Type: application/json</code>.</p>\n"]
    for path, methods in openapi.get("paths", {}).items():
        for method, operation in methods.items():
            parts.append(f"<h2><span class=\"method {html.escape(method)}\">{html.escape(method.upper())}</span> "
                         f"<code>{html.escape(path)}</code></h2>\n"
                         f"<p>{html.escape(str(operation.get('summary', '')))}</p>\n")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None:
                parts.append("<h3>Request body</h3>\n" + _fields_table(body, components))
            answer = operation.get("responses", {}).get("200", {}).get("content", {}).get("application/json", {})
            if "schema" in answer:
                parts.append("<h3>Answer (200)</h3>\n" + _fields_table(answer["schema"], components))
    parts.append("<p class=\"note\">An error answers <code>{\"error\": \"message\"}</code> with its status (400, 404, "
                 "413, 415, 422, 500 or 503).</p>\n</body>\n</html>\n")
    return "".join(parts)


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        return components.get(ref.rsplit("/", 1)[1], {})
    return schema


def _type_of(schema: dict[str, Any], components: dict[str, Any]) -> str:
    """A short type name: ``string``, ``array of number``, ``Answer``, ``string | null`` ..."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type_of(s, components) for s in schema[key])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type_of(schema.get('items', {}), components)}"
    return str(kind)


def _limits(schema: dict[str, Any]) -> list[str]:
    names = {"minItems": "at least {} items", "maxItems": "at most {} items", "minLength": "at least {} characters",
             "maxLength": "at most {} characters", "minimum": ">= {}", "maximum": "<= {}",
             "exclusiveMinimum": "> {}", "exclusiveMaximum": "< {}"}
    found = [text.format(schema[key]) for key, text in names.items() if key in schema]
    for key in ("anyOf", "items"):
        inner = schema.get(key)
        for sub in inner if isinstance(inner, list) else [inner] if isinstance(inner, dict) else []:
            found += [f"each {f}" if key == "items" else f for f in _limits(sub)]
    return found


def _fields_table(schema: dict[str, Any], components: dict[str, Any]) -> str:
    schema = _resolve(schema, components)
    properties = schema.get("properties")
    if not properties:
        return f"<p><code>{html.escape(_type_of(schema, components))}</code></p>\n"
    required = set(schema.get("required", []))
    rows = ["<table>\n<tr><th>field</th><th>type</th><th>required</th><th>default</th><th>limits</th>"
            "<th>description</th></tr>\n"]
    for name, field in properties.items():
        default = json.dumps(field["default"]) if "default" in field else ""
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td>"
                    f"<td><code>{html.escape(_type_of(field, components))}</code></td>"
                    f"<td>{'yes' if name in required else ''}</td><td><code>{html.escape(default)}</code></td>"
                    f"<td>{html.escape(', '.join(_limits(field)))}</td>"
                    f"<td>{html.escape(str(field.get('description', field.get('title', ''))))}</td></tr>\n")
    rows.append("</table>\n")
    return "".join(rows)
