"""fairseq's own binarizer (``fairseq_cli.preprocess.main``), called the way preprocess_GLUE_tasks.sh calls
``fairseq-preprocess``, and the stats read back from the binarized result."""
import logging
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

logger = logging.getLogger(__name__)

PERCENTILES = (50, 90, 95, 99)


def fairseq_preprocess(
    destdir: str, trainpref: str, validprefs: Sequence[str], testprefs: Sequence[str], srcdict: Optional[str],
    workers: int,
) -> None:
    """``fairseq-preprocess --only-source``: the k-th valid/test prefix becomes split ``valid{k}``/``test{k}``
    (``valid``, ``valid1``, ...). Without ``srcdict`` fairseq builds a frequency-sorted dict from train."""
    from fairseq_cli import preprocess

    for p in (trainpref, *validprefs, *testprefs):
        assert "," not in p, p  # fairseq splits --validpref/--testpref on commas
    argv = ["--only-source", "--destdir", destdir, "--workers", str(workers), "--trainpref", trainpref]
    if validprefs:
        argv += ["--validpref", ",".join(validprefs)]
    if testprefs:
        argv += ["--testpref", ",".join(testprefs)]
    if srcdict:
        argv += ["--srcdict", srcdict]
    # fairseq's log (its whole namespace, per-file summaries) goes to destdir/preprocess.log only, as with
    # fairseq-preprocess; main() adds that FileHandler on every call, so it is removed again here.
    plog = logging.getLogger("fairseq_cli.preprocess")
    before, propagate = list(plog.handlers), plog.propagate
    plog.propagate = False
    try:
        preprocess.main(preprocess.options.get_preprocessing_parser().parse_args(argv))
    finally:
        plog.propagate = propagate
        for h in plog.handlers[len(before):]:
            plog.removeHandler(h)
            h.close()


def build_dict_from_data(files: Sequence[str], out_path: str, workers: int) -> None:
    """A frequency-sorted dict over all ``files`` (input0 and input1 share it), built by fairseq's
    ``FairseqTask.build_dictionary`` with fairseq-preprocess's defaults (no threshold, padded to 8)."""
    from fairseq.tasks import FairseqTask

    d = FairseqTask.build_dictionary(list(files), workers=workers, threshold=-1, nwords=-1, padding_factor=8)
    d.save(out_path)


def binarize_workers(n_lines: int, workers: int) -> int:
    """fairseq forks a pool per file; for small files one process is faster."""
    return max(1, min(workers, n_lines // 20000))


def _sizes_and_unk(prefix: str, dict_size: int):
    from fairseq.data.indexed_dataset import MMapIndexedDataset, best_fitting_int_dtype

    ds = MMapIndexedDataset(prefix)
    sizes = np.asarray(ds.sizes, dtype=np.int64)
    # the binarizer stores ids as best_fitting_int_dtype(len(dict)); <unk> is id 3 in every fairseq dict
    tokens = np.fromfile(prefix + ".bin", dtype=best_fitting_int_dtype(dict_size))
    return sizes, int((tokens == 3).sum())


def split_stats(out_dir: str, split: str, n_inputs: int, dict_size: int, max_positions: int, n_expected: int) -> Dict:
    """Lengths as ``sentence_prediction`` sees them: ``<s> a </s>`` or ``<s> a </s> </s> b </s>``."""
    total = np.zeros(n_expected, dtype=np.int64)
    unk = 0
    for j in range(n_inputs):
        sizes, u = _sizes_and_unk(os.path.join(out_dir, f"input{j}", split), dict_size)
        if len(sizes) != n_expected:
            raise RuntimeError(f"input{j}/{split}: {len(sizes)} examples binarized, {n_expected} written")
        total += sizes + 1  # sizes include </s>; +1 for <s> (input0) or the separator </s> (input1)
        unk += u
    pct = np.percentile(total, PERCENTILES) if len(total) else [0] * len(PERCENTILES)
    return {
        "examples": n_expected,
        "length_tokens": {**{f"p{p}": int(round(v)) for p, v in zip(PERCENTILES, pct)},
                          "max": int(total.max(initial=0))},
        "over_max_positions": int((total > max_positions).sum()),
        "unk_tokens": unk,
    }


def label_dictionary_order(label_dict_path: str) -> List[str]:
    """Labels in fairseq's label-dict order: class index k (the model's output k) is entry k."""
    with open(label_dict_path, encoding="utf-8") as f:
        labels = [line.rsplit(" ", 1)[0] for line in f if line.strip()]
    return [x for x in labels if not x.startswith("madeupword")]
