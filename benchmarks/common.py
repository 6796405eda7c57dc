"""What the benchmarks that build fairseq models share: model sizes, models, tasks and criteria built as
``fairseq-train --user-dir acl_fairseq`` builds them over a throw-away folder of the two dictionaries, random
batches of a fixed shape, a training step (``Variant``) and its clock, rounds and peak memory (``PeakMemory``).
Everything else every benchmark shares is the harness's (``import harness``)."""
import ctypes
import gc
import logging
import os
import resource
import statistics
import tempfile
import warnings
from typing import Dict, List, Optional, Sequence

import torch

import harness
from acl_runtime import console

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "acl_fairseq")

# encoder shapes; vocab = symbols in the input dictionary (the embedding matrix is part of every step:
# its dense gradient and its Adam update)
MODEL_SIZES: Dict[str, Dict[str, int]] = {
    # the tests' tiny shape (odd sizes)
    "tiny": dict(layers=3, dim=12, ffn=20, heads=4, vocab=100),
    # MiniLM-L6-H384 (the project's packaged encoder; BERT word-piece vocabulary)
    "minilm": dict(layers=6, dim=384, ffn=1536, heads=12, vocab=30522),
    # roberta.base (GPT-2 BPE vocabulary)
    "base": dict(layers=12, dim=768, ffn=3072, heads=12, vocab=50265),
}


def quiet() -> None:
    """Silence fairseq's/hydra's INFO logs and deprecation warnings (command-line runs only: this
    changes process-wide logging and warning filters)."""
    console.setup_logging("WARNING")
    for name in ("fairseq", "fairseq_cli", "hydra", "acl_fairseq"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def size_args(model: str, seq_len: int) -> List[str]:
    s = MODEL_SIZES[model]
    return [
        "--encoder-layers", str(s["layers"]),
        "--encoder-embed-dim", str(s["dim"]),
        "--encoder-ffn-embed-dim", str(s["ffn"]),
        "--encoder-attention-heads", str(s["heads"]),
        "--max-positions", str(max(seq_len, 64 if model == "tiny" else 512)),
    ]


def make_dict_dir(root: str, vocab: int, num_classes: int) -> str:
    """``root/input0/dict.txt`` (``vocab`` symbols in all, fairseq's 4 specials and ``<mask>``
    included) and ``root/label/dict.txt`` (classes ``0..K-1``). Returns ``root``."""
    os.makedirs(os.path.join(root, "input0"), exist_ok=True)
    os.makedirs(os.path.join(root, "label"), exist_ok=True)
    with open(os.path.join(root, "input0", "dict.txt"), "w") as f:
        f.writelines(f"w{i} 1\n" for i in range(max(vocab - 5, 1)))
    with open(os.path.join(root, "label", "dict.txt"), "w") as f:
        f.writelines(f"{k} 1\n" for k in range(num_classes))
    return root


def train_argv(data: str, criterion: str, arch: str, model: str, seq_len: int, num_classes: int,
               batch: int, device: str, extra: Sequence[str] = (), record: Optional[dict] = None) -> List[str]:
    """fairseq-train's arguments; ``record``: a converted encoder's conventions (its input layout), None for
    RoBERTa's."""
    from acl_runtime import conventions

    layout_flags = conventions.input_layout(record).fairseq_flags()
    argv = [
        data,
        "--user-dir", USER_DIR,
        "--task", "sentence_prediction",
        *layout_flags,
        "--criterion", criterion,
        "--arch", arch,
        *size_args(model, seq_len),
        "--num-classes", str(num_classes),
        "--optimizer", "adamw_torch",  # the recipes' default (fairseq adam's update, fused)
        "--lr", "1e-5",
        "--batch-size", str(batch),
        "--required-batch-size-multiple", "1",
        "--seed", "1",
        *extra,
    ]
    if device == "cpu":
        argv.append("--cpu")
    return argv


def _task(argv: Sequence[str]):
    """``(cfg, task)`` as fairseq-train parses ``argv`` and sets the task up."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                     input_args=list(argv)))
    return cfg, tasks.setup_task(cfg.task)


def build(argv: Sequence[str]):
    """``(cfg, task, model, criterion)`` as fairseq-train builds them from ``argv``."""
    cfg, task = _task(argv)
    return cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def build_criterion(argv: Sequence[str]):
    """``(cfg, task, criterion)`` for ``argv`` (the task is rebuilt; the model is not)."""
    cfg, task = _task(argv)
    return cfg, task, task.build_criterion(cfg.criterion)


def build_trainable(argv: Sequence[str], device, half: bool = False):
    """``(model, optimizer, criterion, task)`` as fairseq's Trainer builds them: the model on ``device`` in training
    mode (fp16 weights and fairseq's FP16Optimizer with ``half``), the optimizer of ``argv`` over its trainable
    parameters."""
    from fairseq import optim

    cfg, task, model, criterion = build(argv)
    model = model.to(device).train()
    if half:
        model = model.half()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optim.FP16Optimizer.build_optimizer(cfg, params) if half else optim.build_optimizer(cfg.optimizer, params)
    return model, opt, criterion, task


def random_tokens(batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """(B, T) right-padded-free token ids: ``<s>`` (0), random ordinary symbols, ``</s>`` (2)."""
    tokens = torch.randint(5, max(vocab - 1, 6), (batch, seq_len), generator=generator)
    tokens[:, 0] = 0
    tokens[:, -1] = 2
    return tokens


def random_sample(batch: int, seq_len: int, vocab: int, num_classes: int, device, seed: int = 0) -> Dict:
    """A ``sentence_prediction`` mini-batch of random tokens; labels cycle through every class."""
    g = torch.Generator().manual_seed(seed)
    tokens = random_tokens(batch, seq_len, vocab, g)
    target = torch.arange(batch) % num_classes
    target = target[torch.randperm(batch, generator=g)]
    return {
        "id": torch.arange(batch).to(device),
        "nsentences": batch,
        "ntokens": batch * seq_len,
        "net_input": {"src_tokens": tokens.to(device), "src_lengths": torch.full((batch,), seq_len).to(device)},
        "target": target.to(device),
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def median_ratio(values: Sequence[float], bases: Sequence[float]) -> float:
    """The median over rounds of each round's value over its base (the same round's)."""
    return median([v / b for v, b in zip(values, bases)])


# ---- peak memory ---------------------------------------------------------------------------------

_LIBC = None


def _malloc_trim() -> None:
    """Give glibc's free heap pages back to the OS, so that the next peak is the step's own."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory that one call adds on top of what is resident/allocated before it, in MiB.

    - CUDA: ``torch.cuda.max_memory_allocated`` minus the allocated bytes before the call (tensors
      only; the caching allocator's reserve and the CUDA context are not counted).
    - CPU on Linux: the process's resident high-water mark (``VmHWM``, reset through
      ``/proc/self/clear_refs``) minus its resident size before the call, after ``gc`` and
      ``malloc_trim``. It counts everything the call touches (activations, gradients, optimizer
      temporaries, allocator fragmentation), not only tensors; it is a whole-process figure, so it is
      only as exact as the allocator's release of freed pages.
    - CPU elsewhere: ``ru_maxrss`` rise (a high-water mark that never falls: only the first call that
      raises it shows a non-zero value); ``method`` says which applies.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.method = "cuda_max_allocated"
        elif _reset_hwm() and _status_kb("VmHWM") is not None:
            self.method = "rss_hwm_delta"
        else:
            self.method = "ru_maxrss_delta"

    def measure(self, fn) -> float:
        gc.collect()
        if self.method == "cuda_max_allocated":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            fn()
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated(self.device) - before) / 2**20
        _malloc_trim()
        if self.method == "rss_hwm_delta":
            _reset_hwm()
            before = _status_kb("VmRSS")
            fn()
            return max(_status_kb("VmHWM") - before, 0) / 1024
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn()
        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, 0) / 1024


def describe_memory(method: str) -> str:
    return {
        "cuda_max_allocated": "peak_mem_mb = torch.cuda.max_memory_allocated during one step minus "
        "the memory allocated before it (activations, gradients, temporaries; not weights/Adam state)",
        "rss_hwm_delta": "peak_mem_mb = resident-set high-water mark during one step minus the "
        "resident size before it (VmHWM reset via /proc/self/clear_refs, after gc + malloc_trim): "
        "activations, gradients and temporaries of the step, allocator slack included; weights and "
        "Adam state are resident before the step and not counted",
        "ru_maxrss_delta": "peak_mem_mb = rise of ru_maxrss (a never-falling high-water mark) during "
        "one step: 0 means 'no new process peak', not 'no memory'",
    }[method]


def step_clock(device):
    """``fn -> (wall seconds, process CPU seconds)`` of ``fn()`` on ``device``: ``harness.timed``, the device
    synchronized around it, the garbage collector off (with one torch thread the CPU time is the step's compute)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None
    return lambda fn: harness.timed(fn, sync=sync, no_gc=True)[:2]


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=prefix)


def interleaved_rounds(systems, time_one, repeats: int, warmup: int, mem_repeats: int, device, seed: int) -> str:
    """Time ``systems`` side by side: ``warmup`` untimed rounds, then ``repeats`` rounds that run every system
    once in a shuffled order (``harness.rounds``), appending ``time_one(s)``'s ``(wall, cpu)`` to ``s.times`` /
    ``s.cpu_times``; then ``mem_repeats`` steps each into ``s.mem`` (:class:`PeakMemory`). Returns the memory
    method."""
    for _ in range(warmup):
        for s in systems:
            time_one(s)
    for _, order in harness.rounds(systems, repeats, "shuffle", seed):
        for s in order:
            wall, cpu = time_one(s)
            s.times.append(wall)
            s.cpu_times.append(cpu)
    mem = PeakMemory(device)
    for _ in range(mem_repeats):
        for s in systems:
            s.mem.append(mem.measure(s.step))
    return mem.method


class Variant:
    def __init__(self, name, scope, kind, task, model, criterion, optimizer, sample):
        self.name, self.scope, self.kind = name, scope, kind
        self.task, self.model, self.criterion, self.optimizer, self.sample = task, model, criterion, optimizer, sample
        self.updates = 0
        self.overflows = 0  # fp16 steps skipped by the loss scaler
        self.times: List[float] = []  # wall seconds per step
        self.cpu_times: List[float] = []  # process CPU seconds per step
        self.mem: List[float] = []

    @property
    def label(self):
        return f"{self.kind}/{self.name}" + (f"/{self.scope}" if self.scope else "")

    def step(self):
        """One fairseq training step (Trainer.train_step's work on one worker)."""
        from fairseq.logging import metrics

        opt = self.optimizer
        opt.zero_grad()
        loss, sample_size, log = self.task.train_step(self.sample, self.model, self.criterion, opt, self.updates)
        opt.multiply_grads(1.0 / float(sample_size or 1.0))
        try:
            grad_norm = opt.clip_grad_norm(0.0)
        except OverflowError:  # fp16: the scaler lowered its scale; fairseq skips the step
            self.overflows += 1
            opt.zero_grad()
            return
        if not torch.isfinite(grad_norm).all():
            raise FloatingPointError(f"{self.label}: non-finite gradient norm")
        opt.step()
        self.updates += 1
        with metrics.aggregate(new_root=True):
            self.task.reduce_metrics([log], self.criterion)
        opt.zero_grad()
