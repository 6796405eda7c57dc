"""Every criterion's total and gradient against METHOD.md, recomputed independently from the model's outputs.

The reference runs the encoder once more, pools each exit's layer itself (``<s>``, or the mean over the
non-padding tokens), runs each exit head by hand (dense, tanh, out_proj; the tiny models have no dropout, so
training and evaluation mode compute the same values) and builds METHOD.md's total from those tensors: the
values with the slow loops on plain floats of ``loss_references``, the gradients with the obvious per-anchor
SupCon (``loss_references.supcon_core``) and plain CE/KL formulas. Nothing of the criterion is called: not its
parts, its logging, ``acl_fairseq.heads`` or ``acl_torch.losses``. The exit layers and their weights are
written out per case, not read from the model.

Sum convention (fairseq's): the criterion returns sum-over-the-batch CE plus N times each batch-mean term, so the
reference total is ``N *`` METHOD.md's per-example objective.
"""
import math
from typing import Dict, List, NamedTuple, Optional

import pytest
import torch
import torch.nn.functional as F

import helpers
import loss_references as ref
from test_criterions import build

HEAD = "sentence_classification_head"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # three classes: a label embedding that is nobody's positive, and a wrong row order, both show
    return helpers.make_data(str(tmp_path_factory.mktemp("totals") / "data"), num_classes=3)["data"]


class Exits(NamedTuple):
    layers: List[int]
    logits: List[torch.Tensor]  # (N, K) each
    u: List[torch.Tensor]  # (N, d): out_proj's input
    c: List[torch.Tensor]  # (N, C): the pooled state the head reads
    w: List[torch.Tensor]  # (K, d): out_proj.weight, the label embeddings


def model_outputs(model, sample, layers: List[int], pooling: str = "cls") -> Exits:
    """Each exit's logits, u, c and W_c, computed here from the encoder's states (one more forward)."""
    tokens = sample["net_input"]["src_tokens"]
    features, extra = model.encoder(tokens, features_only=True, return_all_hiddens=True)
    states = extra["inner_states"]  # num_layers + 1 tensors (T, B, C), the embeddings first
    top = len(states) - 1
    keep = tokens.ne(model.encoder.sentence_encoder.padding_idx).unsqueeze(-1).to(features.dtype)
    out = Exits(list(layers), [], [], [], [])
    for layer in layers:
        x = features if layer == top else states[layer].transpose(0, 1)  # (B, T, C)
        c = x[:, 0, :] if pooling == "cls" else (x * keep).sum(1) / keep.sum(1)
        head = model.classification_heads[HEAD if layer == top else f"{HEAD}_exit{layer}"]
        u = torch.tanh(F.linear(c, head.dense.weight, head.dense.bias))
        out.logits.append(F.linear(u, head.out_proj.weight, head.out_proj.bias))
        out.u.append(u)
        out.c.append(c)
        out.w.append(head.out_proj.weight)
    return out


def exit_weights(layers: List[int], scheme: str) -> List[float]:
    raw = [float(x) for x in layers] if scheme == "layer" else [1.0] * len(layers)
    return [r / sum(raw) for r in raw]


# ---- values: loops on plain floats ---------------------------------------------------------------
def ce_sum_loop(logits: torch.Tensor, y: List[int]) -> float:
    total = 0.0
    for row, t in zip(logits.double().tolist(), y):
        top = max(row)
        total += -(row[t] - top - math.log(sum(math.exp(v - top) for v in row)))
    return total


def kd_loop(student: torch.Tensor, teacher: torch.Tensor, temp: float) -> float:
    """T^2 KL(softmax(z_t / T) || softmax(z_s / T)), averaged over the batch."""
    def softmax(row):
        e = [math.exp(v / temp - max(row) / temp) for v in row]
        return [x / sum(e) for x in e]

    rows = list(zip(student.double().tolist(), teacher.double().tolist()))
    kl = [sum(p * math.log(p / q) for p, q in zip(softmax(t), softmax(s))) for s, t in rows]
    return temp * temp * sum(kl) / len(kl)


def total_loop(name: str, cfg: Dict, ex: Exits, y: torch.Tensor) -> float:
    n, w, labels = len(y), exit_weights(ex.layers, cfg["weighting"]), y.tolist()
    ce = sum(wm * ce_sum_loop(z, labels) for wm, z in zip(w, ex.logits))
    if name == "sentence_ce":
        return ce
    if name == "sentence_scl":
        feats = ex.c if cfg["scl_feature"] == "encoder" else ex.u
        scl = sum(wm * ref.ref_supcon_loss(f.detach(), y, cfg["tau"]) for wm, f in zip(w, feats))
        return (1 - cfg["lam"]) * ce + cfg["lam"] * n * scl
    if name == "multi_exit_kd":
        kd = [kd_loop(z.detach(), ex.logits[-1].detach(), cfg["temp"]) for z in ex.logits[:-1]]
        return ce + cfg["mu"] * n * sum(kd) / len(kd)
    acl = sum(wm * ref.ref_acl_embed_loss(u.detach(), y, wc.detach(), cfg["tau"], cfg["anchors"])
              for wm, u, wc in zip(w, ex.u, ex.w))
    if name in ("acl_embed", "acl_grad"):
        return ce + cfg["lam"] * n * acl
    if name == "acl_cross_layer":
        cl = [ref.ref_cross_layer_loss(u.detach(), ex.u[-1].detach(), y, ex.w[-1].detach(), cfg["cl_tau"])
              for u in ex.u[:-1]]
        return ce + cfg["lam"] * n * acl + cfg["mu"] * n * sum(cl) / len(cl)
    raise ValueError(f"no reference for {name}")


# ---- gradients: the same formulas on tensors, the teacher under stop-gradient --------------------
def supcon_mean(anchors, candidates, a_y, c_y, tau, self_pairs: bool) -> torch.Tensor:
    a, cand = F.normalize(anchors.double(), dim=-1), F.normalize(candidates.double(), dim=-1)
    mask = torch.eye(len(a), len(cand), dtype=torch.bool) if self_pairs else None
    per, valid = ref.supcon_core(a, cand, a_y, c_y, tau, mask)
    return per[valid].sum() / max(int(valid.sum()), 1)


def total_tensor(name: str, cfg: Dict, ex: Exits, y: torch.Tensor, part: str = "all") -> torch.Tensor:
    """The total as a differentiable tensor; ``part``: "all", "ce" (its CE part times the CE weight) or "aux"."""
    n, w = len(y), exit_weights(ex.layers, cfg["weighting"])
    ce = sum(wm * F.cross_entropy(z.double(), y, reduction="sum") for wm, z in zip(w, ex.logits))
    ce_weight, aux = 1.0, ce.new_zeros(())
    k = torch.arange(ex.w[0].shape[0])
    if name == "sentence_scl":
        ce_weight = 1 - cfg["lam"]
        feats = ex.c if cfg["scl_feature"] == "encoder" else ex.u
        aux = cfg["lam"] * n * sum(wm * supcon_mean(f, f, y, y, cfg["tau"], True) for wm, f in zip(w, feats))
    if name in ("acl_embed", "acl_grad", "acl_cross_layer"):
        for wm, u, wc in zip(w, ex.u, ex.w):
            aug, aug_y = torch.cat([u, wc]), torch.cat([y, k])
            anchors, a_y = (aug, aug_y) if cfg["anchors"] == "all" else (u, y)
            aux = aux + cfg["lam"] * n * wm * supcon_mean(anchors, aug, a_y, aug_y, cfg["tau"], True)
    if name == "acl_cross_layer":
        teacher = torch.cat([ex.u[-1], ex.w[-1]]).detach()
        cl = [supcon_mean(u, teacher, y, torch.cat([y, k]), cfg["cl_tau"], False) for u in ex.u[:-1]]
        aux = aux + cfg["mu"] * n * sum(cl) / len(cl)
    if name == "multi_exit_kd":
        t, zt = cfg["temp"], ex.logits[-1].detach().double()
        kd = [t * t * F.kl_div(F.log_softmax(z.double() / t, -1), F.log_softmax(zt / t, -1), log_target=True,
                               reduction="batchmean") for z in ex.logits[:-1]]
        aux = cfg["mu"] * n * sum(kd) / len(kd)
    return {"all": ce_weight * ce + aux, "ce": ce_weight * ce, "aux": aux}[part]


# ---- the cases -----------------------------------------------------------------------------------
DEFAULTS = {"weighting": "layer", "scl_feature": "encoder", "anchors": "all"}
# (criterion, arch, flags, the exits' layers, what the reference reads from the flags)
CASES = {
    "ce-single": ("sentence_ce", "roberta", [], [3], {}),
    "ce-multi-layer": ("sentence_ce", "multi_exit_roberta", [], [1, 2, 3], {}),
    "ce-multi-uniform-subset": ("sentence_ce", "multi_exit_roberta", ["--exit-weighting", "uniform",
                                "--exit-layers", "1,3"], [1, 3], {"weighting": "uniform"}),
    "scl-single": ("sentence_scl", "roberta", ["--scl-weight", "0.6", "--scl-temperature", "0.2"], [3],
                   {"lam": 0.6, "tau": 0.2}),
    "scl-single-head": ("sentence_scl", "roberta", ["--scl-feature", "head"], [3],
                        {"lam": 0.9, "tau": 0.3, "scl_feature": "head"}),
    "scl-multi-mean": ("sentence_scl", "multi_exit_roberta", ["--scl-weight", "0.4", "--exit-pooling", "mean"],
                       [1, 2, 3], {"lam": 0.4, "tau": 0.3, "pooling": "mean"}),
    "embed-single": ("acl_embed", "roberta", ["--acl-weight", "0.7", "--acl-temperature", "0.4"], [3],
                     {"lam": 0.7, "tau": 0.4}),
    "embed-multi-samples": ("acl_embed", "multi_exit_roberta", ["--acl-anchors", "samples", "--acl-weight", "1.3"],
                            [1, 2, 3], {"lam": 1.3, "tau": 0.5, "anchors": "samples"}),
    "embed-multi-uniform-subset": ("acl_embed", "multi_exit_roberta", ["--exit-weighting", "uniform",
                                   "--exit-layers", "2,3"], [2, 3], {"lam": 1.0, "tau": 0.5, "weighting": "uniform"}),
    "grad-single": ("acl_grad", "roberta", ["--acl-weight", "0.5"], [3], {"lam": 0.5, "tau": 0.5}),
    "grad-multi": ("acl_grad", "multi_exit_roberta", ["--acl-temperature", "0.2"], [1, 2, 3],
                   {"lam": 1.0, "tau": 0.2}),
    "cross-layer": ("acl_cross_layer", "multi_exit_roberta", ["--acl-weight", "0.6", "--acl-cl-weight", "0.3"],
                    [1, 2, 3], {"lam": 0.6, "tau": 0.5, "mu": 0.3, "cl_tau": 0.5}),
    "cross-layer-subset-tau": ("acl_cross_layer", "multi_exit_roberta", ["--exit-layers", "1,3", "--exit-weighting",
                               "uniform", "--acl-cl-temperature", "0.2", "--acl-anchors", "samples"], [1, 3],
                               {"lam": 1.0, "tau": 0.5, "mu": 1.0, "cl_tau": 0.2, "weighting": "uniform",
                                "anchors": "samples"}),
    "cross-layer-mean": ("acl_cross_layer", "multi_exit_roberta", ["--exit-pooling", "mean", "--acl-cl-weight",
                         "2.0"], [1, 2, 3], {"lam": 1.0, "tau": 0.5, "mu": 2.0, "cl_tau": 0.5, "pooling": "mean"}),
    "kd": ("multi_exit_kd", "multi_exit_roberta", ["--kd-weight", "0.7", "--kd-temperature", "3"], [1, 2, 3],
           {"mu": 0.7, "temp": 3.0}),
    "kd-subset-uniform": ("multi_exit_kd", "multi_exit_roberta", ["--exit-layers", "2,3", "--exit-weighting",
                          "uniform"], [2, 3], {"mu": 1.0, "temp": 2.0, "weighting": "uniform"}),
}


def setup(data, case: str):
    name, arch, flags, layers, read = CASES[case]
    _, model, crit, sample = build(data, name, arch=arch, extra=flags, num_classes=3)
    cfg = {**DEFAULTS, **read}
    return name, model, crit, sample, layers, cfg


def params(model) -> Dict[str, torch.nn.Parameter]:
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def criterion_gradient(model, crit, sample):
    model.zero_grad()
    loss, n, log = crit(model, sample)
    loss.backward()
    grads = {k: torch.zeros_like(p) if p.grad is None else p.grad.clone() for k, p in params(model).items()}
    return loss.detach(), n, log, grads


def reference_gradient(model, total: torch.Tensor):
    named = params(model)
    grads = torch.autograd.grad(total, list(named.values()), allow_unused=True)
    return {k: torch.zeros_like(p) if g is None else g.float() for (k, p), g in zip(named.items(), grads)}


def assert_same_gradients(got: Dict, want: Dict) -> None:
    assert got.keys() == want.keys()
    scale = max(float(g.abs().max()) for g in want.values())
    for key in want:
        # float32 against float64 through the encoder: measured at most 3.4e-7 of the largest entry (all cases)
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=3e-6 * scale, msg=key)


@pytest.mark.parametrize("case", list(CASES))
def test_criterion_total_and_gradient_equal_an_independent_reference(data, case):
    name, model, crit, sample, layers, cfg = setup(data, case)
    model.eval()
    loss, n, _, grads = criterion_gradient(model, crit, sample)
    y = sample["target"].view(-1)
    ex = model_outputs(model, sample, layers, cfg.get("pooling", "cls"))
    want = total_loop(name, cfg, ex, y)
    assert n == len(y) == 8
    assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-5)
    total = total_tensor(name, cfg, ex, y)
    assert float(total) == pytest.approx(want, rel=1e-9, abs=1e-9)  # the two references agree
    assert_same_gradients(grads, reference_gradient(model, total))


def _teacher_only(model, layers: List[int]) -> Dict[str, torch.nn.Parameter]:
    """The parameters that reach the last exit only: its head, and the encoder layers above every student."""
    top = len(model.encoder.sentence_encoder.layers)
    names = [f"classification_heads.{HEAD}."] + [f"sentence_encoder.layers.{i}." for i in range(layers[-2], top)]
    return {k: p for k, p in params(model).items() if any(s in k for s in names)}


@pytest.mark.parametrize("case,zero_flag", [("cross-layer-subset-tau", "--acl-cl-weight"),
                                            ("kd-subset-uniform", "--kd-weight")])
def test_no_gradient_reaches_the_teacher_through_the_cross_layer_or_kd_term(data, case, zero_flag):
    name, arch, flags, layers, _ = CASES[case]
    grads = []
    for weight in ("1.5", "0"):
        _, model, crit, sample = build(data, name, arch=arch, extra=[*flags, zero_flag, weight], num_classes=3)
        model.eval()
        grads.append(criterion_gradient(model, crit, sample)[3])
    teacher = _teacher_only(model, layers)
    assert any("layers.2." in k for k in teacher) and any("out_proj" in k for k in teacher)
    for key in teacher:  # the same CE and ACL part, with and without the term: only students see it
        torch.testing.assert_close(grads[0][key], grads[1][key], rtol=0, atol=1e-7, msg=key)
    students = [k for k in grads[0] if k not in teacher and f"_exit{layers[0]}." in k]
    assert students and any(not torch.allclose(grads[0][k], grads[1][k]) for k in students)


# ---- the gate: CE alone when it drops, CE plus the term when it keeps ----------------------------
GATED = {  # case -> (criterion flags that set the gate's threshold and scope, the reference's feature scope)
    "grad-single": ("--acl-grad-threshold", "--acl-grad-scope"),
    "grad-multi": ("--acl-grad-threshold", "--acl-grad-scope"),
    "cross-layer": ("--acl-grad-threshold", "--acl-grad-scope"),
    "scl-multi-mean": ("--scl-grad-threshold", "--scl-grad-scope"),
}


def cosine(a: List[torch.Tensor], b: List[torch.Tensor]) -> float:
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float(x.double().pow(2).sum()) for x in a))
    nb = math.sqrt(sum(float(y.double().pow(2).sum()) for y in b))
    return dot / (na * nb)


# both branches forced (-1 keeps, 0.999999 drops) and the default threshold deciding; the features scope shares
# the decision code, so its default threshold is enough there
@pytest.mark.parametrize("threshold,scope", [(-1.0, "params"), (0.0, "params"), (0.999999, "params"),
                                             (0.0, "features")])
@pytest.mark.parametrize("case", list(GATED))
def test_the_gate_gives_ce_alone_when_it_drops_and_ce_plus_the_term_when_it_keeps(data, case, threshold, scope):
    name, arch, flags, layers, read = CASES[case]
    threshold_flag, scope_flag = GATED[case]
    extra = [*flags, threshold_flag, str(threshold), scope_flag, scope]
    if name == "sentence_scl":
        extra.append("--scl-grad")
    _, model, crit, sample = build(data, name, arch=arch, extra=extra, num_classes=3)
    model.train()  # no dropout in the tiny model: the same values as in evaluation, and the gate decides
    loss, _, log, grads = criterion_gradient(model, crit, sample)
    cfg = {**DEFAULTS, **read}
    y = sample["target"].view(-1)
    ex = model_outputs(model, sample, layers, cfg.get("pooling", "cls"))
    ce, aux = total_tensor(name, cfg, ex, y, "ce"), total_tensor(name, cfg, ex, y, "aux")
    assert float(loss) == pytest.approx(total_loop(name, cfg, ex, y), rel=1e-5)  # its value is the whole total
    if scope == "params":
        at = list(params(model).values())
    else:  # the representations the term contrasts: u for ACL, the pooled c for SCL (encoder feature)
        at = ex.c if name == "sentence_scl" else ex.u
    g_ce = torch.autograd.grad(ce, at, retain_graph=True, allow_unused=True)
    g_aux = torch.autograd.grad(aux, at, retain_graph=True, allow_unused=True)
    pairs = [(a, b) for a, b in zip(g_ce, g_aux) if a is not None and b is not None]  # what both reach
    assert len(pairs) < len(at) or scope == "features"  # e.g. out_proj.bias: CE only
    cos = cosine(*zip(*pairs))
    keep = cos >= threshold
    assert abs(cos - threshold) > 1e-4  # not a tie that float rounding could decide either way
    assert float(log["grad_cos"]) == pytest.approx(cos, abs=1e-4)
    assert float(log["conflict"]) == (0.0 if keep else 1.0)
    assert_same_gradients(grads, reference_gradient(model, ce + aux if keep else ce))
    if threshold == -1.0:
        assert keep
    if threshold == 0.999999:
        assert not keep


def test_the_cases_cover_every_criterion_both_models_and_both_weightings():
    names = {c[0] for c in CASES.values()}
    assert names == {"sentence_ce", "sentence_scl", "acl_embed", "acl_grad", "acl_cross_layer", "multi_exit_kd"}
    assert {c[1] for c in CASES.values()} == {"roberta", "multi_exit_roberta"}
    read: List[Optional[str]] = [c[4].get("weighting") for c in CASES.values()]
    assert "uniform" in read and any(len(c[3]) < 3 and c[1] != "roberta" for c in CASES.values())
