"""The exit-request rule (acl_runtime.request.resolve): what decides where rows exit, resolved once at a command's
edge, with the table's ranges and the serving policy as the default."""
import pytest

from acl_runtime import exits, request

SERVING = {"policy": "confidence", "threshold": 0.8, "source": "OUT/onnx/manifest.json"}


@pytest.mark.parametrize("given,want", [
    ({}, request.ExitRequest("confidence", 0.8, None, "OUT/onnx/manifest.json")),
    ({"policy": "entropy"}, request.ExitRequest("entropy", exits.POLICIES["entropy"].default, None, "flag")),
    ({"policy": "patience", "threshold": 3.0}, request.ExitRequest("patience", 3, None, "flag")),
    ({"policy": "none"}, request.ExitRequest(None, None, None, "flag")),
    ({"exit_layer": 2}, request.ExitRequest(None, None, 2, "flag")),
])
def test_the_request_is_resolved_once_with_where_it_came_from(given, want):
    got = request.resolve([1, 2, 3], default=SERVING, source="flag", **given)
    assert got == want and type(got.threshold) is type(want.threshold)


def test_without_a_serving_policy_the_last_exit_decides():
    assert request.resolve([1, 2, 3]) == request.ExitRequest(None, None, None, "default")


@pytest.mark.parametrize("given,message", [
    ({"policy": "entropy", "threshold": 1.5}, r"entropy threshold 1.5 is out of range: it takes \[0, 1\]"),
    ({"policy": "entropy", "threshold": float("nan")}, "entropy threshold nan is out of range"),
    ({"policy": "patience", "threshold": 0}, r"patience threshold 0 is out of range: it takes a positive integer"),
    ({"policy": "entropy", "exit_layer": 2}, "either an early-exit policy or a fixed exit layer, not both"),
    ({"exit_layer": 7}, r"exit layer 7 is not one of the model's exits \[1, 2, 3\]"),
    ({"threshold": 0.5}, "a threshold needs its policy"),
    ({"policy": "median"}, "unknown early-exit policy 'median'"),
])
def test_a_bad_request_is_refused_at_the_edge_with_the_table_range(given, message):
    with pytest.raises(ValueError, match=message):
        request.resolve([1, 2, 3], default=SERVING, **given)


def test_a_regression_head_runs_patience_only():
    with pytest.raises(ValueError, match="needs class probabilities"):
        request.resolve([1, 2], "entropy", regression=True)
    assert request.resolve([1, 2], "patience", regression=True).threshold == exits.POLICIES["patience"].default


@pytest.mark.parametrize("args,default,expected", [
    ((None, None, None), None, (None, None, None)),
    ((None, None, None), {"policy": "entropy", "threshold": 0.4}, ("entropy", 0.4, None)),
    (("none", None, None), {"policy": "entropy", "threshold": 0.4}, (None, None, None)),
    ((None, None, 2), {"policy": "entropy", "threshold": 0.4}, (None, None, 2)),  # a fixed exit wins
    (("confidence", 0.8, None), {"policy": "entropy", "threshold": 0.4}, ("confidence", 0.8, None)),
    (("patience", None, None), {"policy": "entropy", "threshold": 0.4}, ("patience", 2, None)),
])
def test_the_callers_choice_else_the_serving_policy_else_the_last_exit(args, default, expected):
    assert request.resolve([1, 2, 3], *args, default)[:3] == expected


def test_a_threshold_needs_its_policy_and_none_takes_none():
    with pytest.raises(ValueError, match="a threshold needs its policy"):
        request.resolve([1, 2], None, 0.3, None, {"policy": "entropy", "threshold": 0.4})
    with pytest.raises(ValueError, match="takes no threshold"):
        request.resolve([1, 2], "none", 0.3)


@pytest.mark.parametrize("given,message", [
    ({"policy": "entropy", "threshold": 1.5}, r"entropy threshold 1.5 is out of range: it takes \[0, 1\]"),
    ({"policy": "entropy", "exit_layer": 2}, "either an early-exit policy or a fixed exit layer, not both"),
    ({"threshold": 0.5}, "a threshold needs its policy"),
    ({"policy": "none", "threshold": 0.5}, "takes no threshold"),
])
def test_before_the_model_loads_the_flags_alone_are_checked_with_the_same_words(given, message):
    """exit_layers=None: what a command checks at parse time, the same function and messages as after loading."""
    with pytest.raises(ValueError, match=message):
        request.resolve(None, **given)
    with pytest.raises(ValueError, match=message):
        request.resolve([1, 2, 3], **given)


def test_before_the_model_loads_nothing_that_needs_the_model_is_decided():
    assert request.resolve(None, exit_layer=7) == request.ExitRequest(None, None, 7, "argument")
    assert request.resolve(None, "patience") == request.ExitRequest("patience", 2, None, "argument")
    assert request.resolve(None, None, default={"error": "broken"})[:3] == (None, None, None)  # used once loaded
    with pytest.raises(ValueError, match="broken"):
        request.resolve([1, 2], None, default={"error": "broken", "source": "x"})


def test_a_single_exit_model_takes_no_policy_or_exit_layer():
    for given in ({"policy": "entropy"}, {"exit_layer": 3}):
        with pytest.raises(ValueError, match="single exit"):
            request.resolve([3], **given)
    assert request.resolve([3]) == request.LAST_EXIT


def test_a_bad_serving_policy_names_its_file_and_never_blocks_an_explicit_policy():
    bad = {"policy": "entropy", "threshold": True, "source": "OUT/onnx/manifest.json"}
    with pytest.raises(ValueError, match=r"OUT/onnx/manifest.json: its serving policy \"entropy\" .*not a number"):
        request.resolve([1, 2], default=bad)
    assert request.resolve([1, 2], "patience", default=bad).policy == "patience"
