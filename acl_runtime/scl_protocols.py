"""The SCL paper's data protocols (Gunel et al., 2021), seeded and reproducible: pure functions over labels, and
:func:`few_shot_splits`, the splits of a GLUE task that both trainers read (acl-preprocess --few-shot for
fairseq, acl-train-hf --few_shot for the Trainer: the same seed draws the same examples in both).

Few-shot: ``N`` training examples sampled label-stratified from train; the GLUE dev set split, stratified,
into a test half and a validation set of 500 other examples (all the rest if fewer), disjoint.
Label noise: a fraction of training labels replaced by a different label, chosen uniformly.

Stratified sizes use largest-remainder apportionment, so every split keeps its source's label
proportions to within one example per label. Each purpose draws from its own ``random.Random``
seeded with ``f"{seed}:{purpose}"`` (string seeds are hashed with SHA-512: stable across runs and
platforms), so e.g. changing ``N`` does not change the dev split.
"""
import math
import os
import random
from collections import defaultdict
from typing import Callable, Dict, Hashable, List, NamedTuple, Sequence, Tuple

from acl_runtime.glue_tasks import Example, GlueDataError, SplitData, TaskSpec

VALID_SIZE = 500  # the paper's validation size


def _rng(seed: int, purpose: str) -> random.Random:
    return random.Random(f"{seed}:{purpose}")


def apportion(sizes: Dict[Hashable, int], total: int, minimum: int = 0) -> Dict[Hashable, int]:
    """Split ``total`` over groups proportionally to ``sizes`` (largest remainder, ties by key order).

    With ``minimum`` > 0 every non-empty group gets at least that many (taken from the largest shares),
    when ``total`` allows it. Never gives a group more than its size.
    """
    n = sum(sizes.values())
    assert 0 <= total <= n, (total, n)
    keys = sorted(sizes)
    exact = {k: total * sizes[k] / n for k in keys} if n else {k: 0.0 for k in keys}
    share = {k: math.floor(exact[k]) for k in keys}
    rest = total - sum(share.values())
    for k in sorted(keys, key=lambda k: (-(exact[k] - share[k]), keys.index(k)))[:rest]:
        share[k] += 1
    nonempty = [k for k in keys if sizes[k] > 0]
    if minimum and total >= minimum * len(nonempty):
        for k in nonempty:
            while share[k] < min(minimum, sizes[k]):
                donor = max(keys, key=lambda d: (share[d] - minimum, share[d]))
                share[donor] -= 1
                share[k] += 1
    return share


def _by_stratum(strata: Sequence[Hashable], indices: Sequence[int]) -> Dict[Hashable, List[int]]:
    groups: Dict[Hashable, List[int]] = defaultdict(list)
    for i in indices:
        groups[strata[i]].append(i)
    return groups


def stratified_sample(
    strata: Sequence[Hashable], n: int, rng: random.Random, indices: Sequence[int] = None, minimum: int = 0
) -> List[int]:
    """``n`` indices (sorted) drawn from ``indices`` (default: all) keeping the strata proportions."""
    indices = range(len(strata)) if indices is None else indices
    groups = _by_stratum(strata, indices)
    share = apportion({k: len(v) for k, v in groups.items()}, n, minimum)
    picked: List[int] = []
    for k in sorted(groups):
        members = list(groups[k])
        rng.shuffle(members)
        picked.extend(members[: share[k]])
    return sorted(picked)


def few_shot_train(strata: Sequence[Hashable], n: int, seed: int) -> List[int]:
    """``n`` training indices, label-stratified; every label present in train gets at least one when n allows."""
    if not 0 < n <= len(strata):
        raise ValueError(f"--few-shot {n}: the training set has {len(strata)} examples")
    return stratified_sample(strata, n, _rng(seed, "few-shot-train"), minimum=1)


def dev_split(strata: Sequence[Hashable], seed: int, purpose: str = "dev",
              valid_size: int = VALID_SIZE) -> Tuple[List[int], List[int]]:
    """``(valid, test)`` index lists: test = half the dev set (floor), valid = ``valid_size`` others
    (or all the rest if fewer); both stratified by ``strata``, disjoint."""
    rng = _rng(seed, purpose)
    test = stratified_sample(strata, len(strata) // 2, rng)
    taken = set(test)
    rest = [i for i in range(len(strata)) if i not in taken]
    valid = stratified_sample(strata, min(valid_size, len(rest)), rng, indices=rest)
    return valid, test


def add_label_noise(labels: Sequence[str], fraction: float, label_set: Sequence[str],
                    seed: int) -> Tuple[List[str], List[int]]:
    """Replace ``round(fraction * len(labels))`` labels, at seeded random positions, by a different label
    drawn uniformly from ``label_set``. Returns the new labels and the (sorted) changed positions."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"--label-noise {fraction}: must be in [0, 1]")
    rng = _rng(seed, "label-noise")
    flipped = sorted(rng.sample(range(len(labels)), round(fraction * len(labels))))
    out = list(labels)
    choices = sorted(label_set)
    for i in flipped:
        out[i] = rng.choice([c for c in choices if c != labels[i]])
    return out, flipped


class Split(NamedTuple):
    name: str  # fairseq's split name: train, valid, valid1, test, test1
    source: str  # the .tsv file it comes from
    examples: List[Example]


def nth(base: str, k: int) -> str:
    """fairseq's name of the k-th split of a kind: valid, valid1, ..."""
    return base if k == 0 else f"{base}{k}"


def strata(spec: TaskSpec) -> Callable[[Example], Hashable]:
    """What a split is stratified by: the label; STS-B's score rounded to 0..5, so that the splits keep the score
    distribution."""
    return (lambda e: round(float(e.label))) if spec.regression else (lambda e: e.label)


def few_shot_splits(spec: TaskSpec, train: List[Example], devs: List[SplitData], n: int, seed: int) -> List[Split]:
    """N stratified training examples; each dev file k split into valid{k} (500) and test{k} (half), labelled."""
    key = strata(spec)
    try:
        idx = few_shot_train([key(e) for e in train], n, seed)
    except ValueError as e:
        raise GlueDataError(f"{e}. Fix: choose a smaller --few-shot N") from None
    out = [Split("train", "train.tsv", [train[i] for i in idx])]
    for k, dev in enumerate(devs):
        valid, test = dev_split([key(e) for e in dev.examples], seed, purpose=f"dev{k}")
        source = os.path.basename(dev.path)
        out.append(Split(nth("valid", k), source, [dev.examples[i] for i in valid]))
        out.append(Split(nth("test", k), source, [dev.examples[i] for i in test]))
    return out
