"""Typed results over the CLI's JSON reports.

Each report is a frozen dataclass whose fields are the report's top-level JSON keys (the
schema `memwall <command> --json` documents); nested objects are typed where they are
common to several reports (the model, the GPU fit, the speed, the doctor) and otherwise a
:class:`Record` (attribute access over the JSON object). ``to_dict()`` gives back the JSON
exactly as the CLI wrote it, including any key this version of the package does not know.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

__all__ = [
    "Record",
    "ModelInfo",
    "GpuFit",
    "Speed",
    "DoctorStep",
    "DoctorReport",
    "TrainReport",
    "InferReport",
    "ServeReport",
    "RooflineReport",
    "Plan",
    "PlanReport",
    "InspectReport",
    "ModelEntry",
    "GpuSpec",
    "format_bytes",
]


def format_bytes(n: Optional[float]) -> str:
    """Bytes as the CLI prints them: ``74.79 GiB``, ``500.00 MiB``, ``12 B``."""
    if n is None:
        return "-"
    b = float(n)
    kib = 1024.0
    if abs(b) >= kib**3:
        return f"{b / kib**3:.2f} GiB"
    if abs(b) >= kib**2:
        return f"{b / kib**2:.2f} MiB"
    if abs(b) >= kib:
        return f"{b / kib:.2f} KiB"
    return f"{int(b)} B"


def _wrap(value: Any) -> Any:
    """JSON objects become Records (lists of them, lists of Records); the rest as is."""
    if isinstance(value, dict):
        return Record(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class Record(Mapping[str, Any]):
    """A JSON object of a report with attribute access: ``r.layout.tp`` or ``r["layout"]["tp"]``.

    Nested objects are Records too; ``to_dict()`` gives the plain JSON back.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_data", dict(data))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r} (fields: {', '.join(self._data)})"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("report records are read-only")

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __dir__(self) -> List[str]:
        return sorted(set(self._data) | {"to_dict"})

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Record):
            return bool(self._data == other._data)
        if isinstance(other, dict):
            return bool(self._data == other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object, as plain dicts and lists (a copy)."""
        return copy.deepcopy(self._data)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={_short(v)}" for k, v in self._data.items())
        return f"Record({inner})"


def _short(v: Any, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Building dataclasses from JSON


def _conv(fn: Callable[[Any], Any]) -> Dict[str, Any]:
    return {"conv": fn}


def _opt(conv: Optional[Callable[[Any], Any]] = None) -> Any:
    """A field that may be absent from the JSON (then ``None``)."""
    return field(default=None, metadata=_conv(conv) if conv else {})


def _req(conv: Optional[Callable[[Any], Any]] = None) -> Any:
    """A field every report of its kind has (the default only keeps dataclass field order free
    on Python 3.9, which has no keyword-only fields)."""
    return field(default=None, metadata=_conv(conv) if conv else {})


_T = TypeVar("_T", bound="_Json")


@dataclass(frozen=True, repr=False)
class _Json:
    """Base of the typed results: built from a JSON object, kept whole for ``to_dict()``."""

    @classmethod
    def _from_json(cls: "type[_T]", data: Mapping[str, Any]) -> _T:
        kwargs: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                value = data[f.name]
                conv = f.metadata.get("conv")
                if value is not None and conv is not None:
                    value = conv(value)
                kwargs[f.name] = value
        obj = cls(**kwargs)
        object.__setattr__(obj, "_raw", dict(data))
        return obj

    def __getattr__(self, name: str) -> Any:
        # a key of a newer CLI that this package does not declare yet
        if not name.startswith("_"):
            raw = self.__dict__.get("_raw", {})
            if name in raw:
                return _wrap(raw[name])
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def to_dict(self) -> Dict[str, Any]:
        """The report's JSON, exactly as ``memwall … --json`` writes it (a copy)."""
        raw = self.__dict__.get("_raw")
        if raw is None:
            return dataclasses.asdict(self)
        return copy.deepcopy(raw)


def _list_of(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda values: [conv(v) for v in values]


def _record(value: Any) -> Any:
    return _wrap(value)


# ---------------------------------------------------------------------------------------------
# Common parts


@dataclass(frozen=True, repr=False)
class ModelInfo(_Json):
    """The model a report is about."""

    label: str = _req()
    hf_repo: Optional[str] = _opt()
    model_type: str = _req()
    origin: str = _req()
    num_layers: int = _req()
    params_total: int = _req()
    params_trainable: Optional[int] = _opt()

    def __repr__(self) -> str:
        return (
            f"ModelInfo({self.label!r}, model_type={self.model_type!r}, "
            f"num_layers={self.num_layers}, params_total={self.params_total})"
        )


@dataclass(frozen=True, repr=False)
class GpuFit(_Json):
    """The fit test on one GPU: the peak plus what PyTorch's allocator does not see."""

    id: str = _req()
    name: str = _req()
    memory_bytes: int = _req()
    cuda_context_bytes: int = _req()
    cublas_workspace_bytes: int = _req()
    alloc_margin_bytes: int = _req()
    required_bytes: int = _req()
    fits: bool = _req()
    headroom_bytes: int = _req()

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"GpuFit({self.id!r}: needs {format_bytes(self.required_bytes)} of "
            f"{format_bytes(self.memory_bytes)}, {verdict})"
        )


@dataclass(frozen=True, repr=False)
class Speed(_Json):
    """The step-time model's estimate."""

    step_s: float = _req()
    tokens_per_s_per_gpu: float = _req()
    tokens_per_s: float = _req()
    mfu: float = _req()
    hfu: float = _req()
    breakdown: Dict[str, float] = _req()
    micro_batches: Optional[int] = _opt()

    def __repr__(self) -> str:
        return (
            f"Speed(step_s={self.step_s:.3f}, tokens_per_s_per_gpu={self.tokens_per_s_per_gpu:.0f}, "
            f"mfu={self.mfu:.3f})"
        )


def _command(kind: str, args: Optional[List[str]]) -> Optional[str]:
    if args is None:
        return None
    return shlex.join(["memwall", kind, *args])


def kwargs_from_args(args: List[str]) -> Dict[str, Any]:
    """CLI arguments (``["--batch", "2", "--checkpointing"]``) as keyword arguments."""
    out: Dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        name = flag.lstrip("-").replace("-", "_")
        if "=" in name:
            name, _, value = name.partition("=")
            out[name] = _scalar(value)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[name] = _scalar(args[i + 1])
            i += 2
        else:
            out[name] = True
            i += 1
    if out.pop("no_dropout", None):
        out["dropout"] = False
    return out


def _scalar(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True, repr=False)
class DoctorStep(_Json):
    """One fix of the doctor, cumulative with the ones before it."""

    change: str = _req()
    changes_result: bool = _req()
    train_args: Optional[List[str]] = _opt()
    infer_args: Optional[List[str]] = _opt()
    peak_bytes: int = _req()
    required_bytes: int = _req()
    fits: bool = _req()
    step_s: Optional[float] = _opt()
    phase: str = _req()

    @property
    def command(self) -> str:
        """The command line that reproduces this step (``memwall train --model … --batch …``)."""
        if self.train_args is not None:
            return _command("train", self.train_args) or ""
        return _command("infer", self.infer_args) or ""

    @property
    def kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for :func:`memwall.train` (or :func:`memwall.infer`) that
        reproduce this step."""
        return kwargs_from_args(self.train_args or self.infer_args or [])

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return f"DoctorStep({self.change!r}: peak {format_bytes(self.peak_bytes)}, {verdict})"


@dataclass(frozen=True, repr=False)
class DoctorReport(_Json):
    """Where the peak is and the cheapest fixes, in order, until it fits."""

    model: ModelInfo = _req(ModelInfo._from_json)
    kind: str = _req()
    fits: bool = _req()
    fixed: bool = _req()
    diagnosis: Record = _req(_record)
    steps: List[DoctorStep] = _req(_list_of(DoctorStep._from_json))

    @property
    def first_fitting_step(self) -> Optional[DoctorStep]:
        """The first step after which the run fits, or ``None`` when none does."""
        return next((s for s in self.steps if s.fits), None)

    def __repr__(self) -> str:
        if self.fits:
            state = "fits as it is"
        elif self.fixed:
            step = self.first_fitting_step
            state = f"fits after {len(self.steps)} step(s)" + (f": {step.command}" if step else "")
        else:
            state = f"does not fit after {len(self.steps)} step(s)"
        return f"DoctorReport({self.model.label!r}, {self.kind}: {state})"

    def _repr_html_(self) -> str:
        rows = [
            (
                html.escape(s.change),
                format_bytes(s.peak_bytes),
                format_bytes(s.required_bytes),
                "yes" if s.fits else "no",
                f"<code>{html.escape(s.command)}</code>",
            )
            for s in self.steps
        ]
        head = "fits as it is" if self.fits else ("fixed" if self.fixed else "not fixed")
        return _html(
            f"memwall doctor · {html.escape(self.model.label)} · {head}",
            ["change", "peak", "required", "fits", "command"],
            rows,
        )


def _html(title: str, header: List[str], rows: Sequence[Sequence[str]], foot: str = "") -> str:
    th = "".join(f"<th style='text-align:left'>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    foot_html = f"<p>{foot}</p>" if foot else ""
    return (
        f"<div class='memwall'><p><b>{title}</b></p>"
        f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>{foot_html}</div>"
    )


def _breakdown_rows(at_peak: Mapping[str, int], peak: int) -> List[Tuple[str, ...]]:
    rows: List[Tuple[str, ...]] = []
    for name, b in at_peak.items():
        if b:
            share = f"{100.0 * b / peak:.1f}%" if peak else "-"
            rows.append((html.escape(name), format_bytes(b), share))
    return rows


def _fit_line(gpu: Optional[GpuFit]) -> str:
    if gpu is None:
        return ""
    verdict = (
        f"fits, {format_bytes(gpu.headroom_bytes)} free"
        if gpu.fits
        else f"does not fit, {format_bytes(-gpu.headroom_bytes)} short"
    )
    return (
        f"on {html.escape(gpu.id)} ({html.escape(gpu.name)}): needs "
        f"{format_bytes(gpu.required_bytes)} of {format_bytes(gpu.memory_bytes)} — {verdict} "
        f"(CUDA context {format_bytes(gpu.cuda_context_bytes)}, cuBLAS workspace "
        f"{format_bytes(gpu.cublas_workspace_bytes)}, allocator margin "
        f"{format_bytes(gpu.alloc_margin_bytes)} outside the peak)"
    )


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True, repr=False)
class TrainReport(_Json):
    """``memwall train``: the peak memory of one training step, its phase and breakdown, the fit
    on the GPU, the step time; with ``gpus > 1`` or a strategy, every rank; when it does not
    fit, the doctor's steps."""

    model: ModelInfo = _req(ModelInfo._from_json)
    workload: Record = _req(_record)
    runtime_profile: str = _req()
    peak_bytes: int = _req()
    phase: str = _req()
    at_peak: Dict[str, int] = _req()
    gpu: GpuFit = _req(GpuFit._from_json)
    speed: Optional[Speed] = _opt(Speed._from_json)
    phase_peaks: Optional[Dict[str, int]] = _opt()
    distributed: Optional[Record] = _opt(_record)
    ranks: Optional[List[Record]] = _opt(_record)
    doctor: Optional[DoctorReport] = _opt(DoctorReport._from_json)

    @property
    def fits(self) -> bool:
        """Whether the step fits the GPU (with the allocator margin and the CUDA context)."""
        return bool(self.gpu.fits)

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"TrainReport({self.model.label!r}, peak_bytes={self.peak_bytes} "
            f"({format_bytes(self.peak_bytes)}), phase={self.phase!r}, "
            f"gpu={self.gpu.id!r}: {verdict})"
        )

    def _repr_html_(self) -> str:
        w = self.workload
        title = (
            f"memwall train · {html.escape(self.model.label)} · batch {w.get('batch')} × seq "
            f"{w.get('seq')} · {html.escape(str(w.get('precision')))} · "
            f"{html.escape(str(w.get('optimizer')))} — peak {format_bytes(self.peak_bytes)} "
            f"during {html.escape(self.phase)}"
        )
        foot = _fit_line(self.gpu)
        if self.speed is not None:
            foot += (
                f"<br>speed: {self.speed.step_s:.3f} s per step, "
                f"{self.speed.tokens_per_s_per_gpu:.0f} tokens/s per GPU, "
                f"MFU {100 * self.speed.mfu:.1f}%"
            )
        if self.doctor is not None:
            step = self.doctor.first_fitting_step
            if step is not None:
                foot += f"<br>first fix that fits: {html.escape(step.change)}: <code>{html.escape(step.command)}</code>"
        return _html(
            title,
            ["at the peak", "bytes", "share"],
            _breakdown_rows(self.at_peak, self.peak_bytes),
            foot,
        )


@dataclass(frozen=True, repr=False)
class InferReport(_Json):
    """``memwall infer``: the peak memory of ``generate`` (prefill, then decode)."""

    model: ModelInfo = _req(ModelInfo._from_json)
    workload: Record = _req(_record)
    weights_from: str = _req()
    runtime_profile: str = _req()
    peak_bytes: int = _req()
    phase: str = _req()
    at_peak: Dict[str, int] = _req()
    weights_bytes: int = _req()
    kv_cache_bytes: int = _req()
    prefill_peak_bytes: int = _req()
    gpu: GpuFit = _req(GpuFit._from_json)
    doctor: Optional[DoctorReport] = _opt(DoctorReport._from_json)

    @property
    def fits(self) -> bool:
        """Whether generation fits the GPU."""
        return bool(self.gpu.fits)

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"InferReport({self.model.label!r}, peak_bytes={self.peak_bytes} "
            f"({format_bytes(self.peak_bytes)}), phase={self.phase!r}, "
            f"gpu={self.gpu.id!r}: {verdict})"
        )

    def _repr_html_(self) -> str:
        title = (
            f"memwall infer · {html.escape(self.model.label)} — peak "
            f"{format_bytes(self.peak_bytes)} during {html.escape(self.phase)}"
        )
        return _html(
            title,
            ["at the peak", "bytes", "share"],
            _breakdown_rows(self.at_peak, self.peak_bytes),
            _fit_line(self.gpu),
        )


@dataclass(frozen=True, repr=False)
class ServeReport(_Json):
    """``memwall serve``: the KV-cache capacity of a vLLM deployment, by vLLM's accounting."""

    model: ModelInfo = _req(ModelInfo._from_json)
    gpu: str = _req()
    runtime_profile: str = _req()
    config: Record = _req(_record)
    weights_from: str = _req()
    estimated_inputs: List[str] = _req()
    requested_memory_bytes: int = _req()
    available_kv_bytes: int = _req()
    num_kv_heads_per_rank: int = _req()
    groups: List[Record] = _req(_record)
    bytes_per_block: int = _req()
    num_gpu_blocks: int = _req()
    kv_tokens: int = _req()
    fits_max_model_len: bool = _req()
    max_model_len_that_fits: int = _req()
    #: models with Mamba or gated-DeltaNet layers: prefix caching, ``mamba_cache_mode``, the
    #: aligned block size, the state page and state blocks per request (``None`` otherwise)
    state_cache: Optional[Record] = _opt(_record)
    max_concurrency: Dict[str, float] = _req()
    fragmentation: List[Record] = _req(_record)
    vllm_serve_command: str = _req()

    def __repr__(self) -> str:
        return (
            f"ServeReport({self.model.label!r}, gpu={self.gpu!r}, kv_tokens={self.kv_tokens}, "
            f"num_gpu_blocks={self.num_gpu_blocks}, fits_max_model_len={self.fits_max_model_len})"
        )

    def _repr_html_(self) -> str:
        rows = [
            ("requested memory", format_bytes(self.requested_memory_bytes)),
            ("available for the KV cache", format_bytes(self.available_kv_bytes)),
            ("GPU blocks", str(self.num_gpu_blocks)),
            ("KV tokens", str(self.kv_tokens)),
            ("max model len that fits", str(self.max_model_len_that_fits)),
        ] + [
            (f"concurrency at {html.escape(k)} tokens", f"{v:.1f}")
            for k, v in (self.max_concurrency or {}).items()
        ]
        return _html(
            f"memwall serve · {html.escape(self.model.label)} on {html.escape(self.gpu)}",
            ["", "value"],
            rows,
            f"<code>{html.escape(self.vllm_serve_command)}</code>",
        )


@dataclass(frozen=True, repr=False)
class RooflineReport(_Json):
    """``memwall roofline``: FLOPs, bytes and bound of each op of a step, prefill or decode."""

    model: ModelInfo = _req(ModelInfo._from_json)
    gpu: str = _req()
    workload: Record = _req(_record)
    ridge_flops_per_byte: float = _req()
    ops: List[Record] = _req(_record)
    total_flops: float = _req()
    total_bytes: float = _req()
    time_s: float = _req()
    tokens_per_s: float = _req()
    decode: Optional[Record] = _opt(_record)

    def __repr__(self) -> str:
        return (
            f"RooflineReport({self.model.label!r}, gpu={self.gpu!r}, "
            f"phase={self.workload.get('phase')!r}, time_s={self.time_s:.4g}, "
            f"tokens_per_s={self.tokens_per_s:.0f})"
        )

    def _repr_html_(self) -> str:
        rows = [
            (
                html.escape(str(op.get("name"))),
                f"{op.get('flops', 0):.3g}",
                format_bytes(op.get("bytes")),
                f"{op.get('intensity', 0):.1f}",
                html.escape(str(op.get("bound"))),
                f"{1e3 * op.get('time_s', 0):.3f}",
            )
            for op in self.ops
        ]
        return _html(
            f"memwall roofline · {html.escape(self.model.label)} on {html.escape(self.gpu)} · "
            f"{html.escape(str(self.workload.get('phase')))}",
            ["op", "FLOPs", "bytes", "FLOP/byte", "bound", "ms"],
            rows,
            f"total {self.time_s:.4g} s, {self.tokens_per_s:.0f} tokens/s; ridge "
            f"{self.ridge_flops_per_byte:.1f} FLOP/byte",
        )


@dataclass(frozen=True, repr=False)
class Plan(_Json):
    """One ranked training configuration of ``memwall plan``."""

    rank: int = _req()
    fits: bool = _req()
    peak_bytes: int = _req()
    headroom_bytes: int = _req()
    host_bytes_per_node: int = _req()
    step_s: float = _req()
    tokens_per_s_per_gpu: float = _req()
    mfu: float = _req()
    breakdown: Dict[str, float] = _req()
    layout: Record = _req(_record)
    micro_batch: int = _req()
    grad_accum: int = _req()
    seq: int = _req()
    checkpointing: bool = _req()
    precision: str = _req()
    optimizer: str = _req()
    lora_rank: Optional[int] = _opt()
    qlora: bool = _req()
    changes_result: List[str] = _req()
    train_args: List[str] = _req()

    @property
    def command(self) -> str:
        """``memwall train …`` for this plan."""
        return _command("train", self.train_args) or ""

    @property
    def kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for :func:`memwall.train` that reproduce this plan."""
        return kwargs_from_args(self.train_args)

    def __repr__(self) -> str:
        lay = self.layout
        return (
            f"Plan(rank={self.rank}, {lay.get('strategy')} tp={lay.get('tp')} pp={lay.get('pp')} "
            f"micro_batch={self.micro_batch}, peak {format_bytes(self.peak_bytes)}, "
            f"{self.tokens_per_s_per_gpu:.0f} tokens/s per GPU)"
        )


@dataclass(frozen=True, repr=False)
class PlanReport(_Json):
    """``memwall plan``: the fastest training configurations that fit, ranked."""

    model: ModelInfo = _req(ModelInfo._from_json)
    asked: Record = _req(_record)
    plans: List[Plan] = _req(_list_of(Plan._from_json))
    fitting: int = _req()
    candidates_evaluated: int = _req()
    search_space: Record = _req(_record)
    would_fit_with: Optional[List[Record]] = _opt(_record)

    @property
    def best(self) -> Optional[Plan]:
        """The fastest plan that fits, or ``None``."""
        return next((p for p in self.plans if p.fits), None)

    def __repr__(self) -> str:
        best = self.best
        return (
            f"PlanReport({self.model.label!r}, fitting={self.fitting}, "
            f"best={best.command if best else None!r})"
        )

    def _repr_html_(self) -> str:
        rows = []
        for p in self.plans:
            lay = p.layout
            rows.append(
                (
                    str(p.rank),
                    html.escape(
                        f"{lay.get('strategy')} tp{lay.get('tp')} pp{lay.get('pp')} "
                        f"cp{lay.get('cp')} ep{lay.get('ep')}"
                    ),
                    f"{p.micro_batch} × {p.grad_accum}",
                    html.escape(p.precision),
                    html.escape(p.optimizer),
                    "yes" if p.checkpointing else "no",
                    format_bytes(p.peak_bytes),
                    f"{p.step_s:.3f}",
                    f"{p.tokens_per_s_per_gpu:.0f}",
                )
            )
        return _html(
            f"memwall plan · {html.escape(self.model.label)} · {self.fitting} fitting of "
            f"{self.candidates_evaluated} evaluated",
            ["#", "layout", "micro × accum", "precision", "optimizer", "ckpt", "peak", "s/step",
             "tokens/s/GPU"],
            rows,
        )


@dataclass(frozen=True, repr=False)
class InspectReport(_Json):
    """``memwall inspect``: exact parameter counts by component and the bytes per dtype."""

    model: ModelInfo = _req(ModelInfo._from_json)
    checkpoint_dtype: Optional[str] = _opt()
    params: Dict[str, int] = _req()
    bytes_by_dtype: Dict[str, int] = _req()
    #: the checkpoint's headers (format, files, storage, tensor_bytes, extra_layers, weights),
    #: when the model came with weight files
    checkpoint: Optional[Dict[str, Any]] = _opt()

    def __repr__(self) -> str:
        return f"InspectReport({self.model.label!r}, params={self.params.get('total')})"


@dataclass(frozen=True, repr=False)
class ModelEntry(_Json):
    """A model of the embedded catalogue (``memwall models``)."""

    id: str = _req()
    hf_repo: str = _req()
    model_type: str = _req()
    params_total: int = _req()
    published_params: Optional[str] = _opt()
    source: str = _req()

    def __repr__(self) -> str:
        return f"ModelEntry({self.id!r}, {self.hf_repo!r}, params_total={self.params_total})"


@dataclass(frozen=True, repr=False)
class GpuSpec(_Json):
    """A GPU ``gpu=`` accepts (``memwall gpus``)."""

    id: str = _req()
    name: str = _req()
    vendor: str = _req()
    architecture: str = _req()
    memory_bytes: int = _req()
    memory_type: str = _req()
    memory_bandwidth_bytes_per_s: float = _req()
    l2_bytes: Optional[int] = _opt()
    peak_flops_per_s: Dict[str, float] = _req()
    interconnect: Optional[Record] = _opt(_record)
    pcie: Optional[Record] = _opt(_record)
    network_bytes_per_s: Optional[float] = _opt()
    matmul_efficiency: Optional[float] = _opt()
    tdp_w: Optional[int] = _opt()
    sources: List[str] = _req()

    def __repr__(self) -> str:
        return f"GpuSpec({self.id!r}, {self.name!r}, memory={format_bytes(self.memory_bytes)})"
