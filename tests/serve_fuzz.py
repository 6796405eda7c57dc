"""hypothesis strategies for acl-serve's request bodies, built from the schema the server validates them with
(acl_runtime.serve.schema, through the JSON Schema of its OpenAPI document): bodies the schema accepts, the same
bodies with one part replaced, removed or set (a field the schema declares there, or any), and any JSON or bytes."""
import json

from hypothesis import strategies as st

from acl_runtime.serve import schema

# values that reach the model more often than random text would (a field's name -> extra examples)
HINTS = {"policy": ["entropy", "confidence", "patience", "none"], "threshold": [0.3, 1, 2, 0.9],
         "exit_layer": [1, 2, 3]}
TEXTS = st.one_of(st.sampled_from(["good", "the plot was not clever", "café naïve", "  ", ""]),
                  st.text(max_size=12))
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 10) | st.floats(allow_nan=False) | TEXTS,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXTS, inner, max_size=3),
                    max_leaves=8)
DROP = object()


def components():
    return schema.openapi("0")["components"]["schemas"]


def from_schema(node: dict, defs: dict, name: str = "") -> st.SearchStrategy:
    """Values that ``node`` (a JSON Schema of the OpenAPI components ``defs``) accepts."""
    if "$ref" in node:
        target = node["$ref"].rsplit("/", 1)[1]
        return st.deferred(lambda: from_schema(defs[target], defs))
    if "anyOf" in node:
        return st.one_of([from_schema(n, defs, name) for n in node["anyOf"]])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    hinted = st.sampled_from(HINTS[name]) if name in HINTS else st.nothing()
    if kind == "object":
        props, required = node["properties"], set(node.get("required", ()))
        return st.fixed_dictionaries({k: from_schema(v, defs, k) for k, v in props.items() if k in required},
                                     optional={k: from_schema(v, defs, k) for k, v in props.items()
                                               if k not in required})
    if kind == "array":
        return st.lists(from_schema(node.get("items", {}), defs, name), min_size=node.get("minItems", 0),
                        max_size=min(node.get("maxItems", 4), 4))
    if kind == "string":
        return hinted | TEXTS
    if kind == "integer":
        return hinted | st.integers(min_value=node.get("minimum", -2), max_value=8)
    if kind == "number":
        return hinted | st.floats(-2, 3, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return JSON


def _paths(doc, at=()):
    yield at
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from _paths(value, at + (key,))


def _replace(doc, path, value):
    if not path:
        return value
    doc = json.loads(json.dumps(doc))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is DROP:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _declared(obj: dict, defs: dict) -> list:
    """The fields declared by every schema component that ``obj`` could be (its keys declared, its required
    ones present)."""
    fits = [n for n in defs.values() if "properties" in n and set(obj) <= set(n["properties"])
            and set(n.get("required", ())) <= set(obj)]
    return sorted({k for n in fits for k in n["properties"]})


@st.composite
def _mutated(draw, valid, defs):
    """A valid body with one part changed: a value replaced by any JSON or removed, or one field of an object (one
    its schema declares, else any name) set to any JSON."""
    doc = draw(valid)
    paths = list(_paths(doc))
    objects = [p for p in paths if isinstance(_get(doc, p), dict)]
    if not objects or draw(st.booleans()):
        path = draw(st.sampled_from(paths))
        return _replace(doc, path, draw(JSON | st.just(DROP)) if path else draw(JSON))
    at = draw(st.sampled_from(objects))
    declared = _declared(_get(doc, at), defs)
    key = draw(st.sampled_from(declared) if declared and draw(st.integers(0, 3)) else TEXTS)
    return _replace(doc, at + (key,), draw(JSON))


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def bodies(struct: str) -> st.SearchStrategy:
    """Request bodies (bytes) for the route whose schema is the component ``struct``."""
    defs = components()
    valid = from_schema(defs[struct], defs)
    mutated = _mutated(valid, defs)
    docs = st.one_of(valid, mutated, mutated, JSON)
    return st.one_of(docs.map(lambda d: json.dumps(d).encode()), st.binary(max_size=40))
