"""Type stubs of memwall: the CLI's estimates from Python (see the package docstring)."""

import os
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

__version__: str

# A model: a catalogue id, a Hub repo id (local cache), a path (config.json, model directory,
# .safetensors, .gguf), a dict of a config.json, a transformers.PretrainedConfig (anything with
# to_dict()), or a model with a .config.
ModelArg = Union[str, os.PathLike[str], Mapping[str, Any], Any]

class MemwallError(ValueError):
    message: str
    hint: Optional[str]
    flag: Optional[str]
    field: Optional[str]
    lines: List[str]
    def __init__(
        self,
        message: str,
        hint: Optional[str] = ...,
        *,
        field: Optional[str] = ...,
        flag: Optional[str] = ...,
        lines: Optional[Sequence[str]] = ...,
    ) -> None: ...

class MemwallWarning(UserWarning): ...

class Record(Mapping[str, Any]):
    def __init__(self, data: Mapping[str, Any]) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
    def __getitem__(self, key: str) -> Any: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def to_dict(self) -> Dict[str, Any]: ...

class _Json:
    def to_dict(self) -> Dict[str, Any]: ...
    def __getattr__(self, name: str) -> Any: ...

class ModelInfo(_Json):
    label: str
    hf_repo: Optional[str]
    model_type: str
    origin: str
    num_layers: int
    params_total: int
    params_trainable: Optional[int]

class GpuFit(_Json):
    id: str
    name: str
    memory_bytes: int
    cuda_context_bytes: int
    cublas_workspace_bytes: int
    alloc_margin_bytes: int
    required_bytes: int
    fits: bool
    headroom_bytes: int

class Speed(_Json):
    step_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    mfu: float
    hfu: float
    breakdown: Dict[str, float]
    micro_batches: Optional[int]

class DoctorStep(_Json):
    change: str
    changes_result: bool
    train_args: Optional[List[str]]
    infer_args: Optional[List[str]]
    peak_bytes: int
    required_bytes: int
    fits: bool
    step_s: Optional[float]
    phase: str
    @property
    def command(self) -> str: ...
    @property
    def kwargs(self) -> Dict[str, Any]: ...

class DoctorReport(_Json):
    model: ModelInfo
    kind: str
    fits: bool
    fixed: bool
    diagnosis: Record
    steps: List[DoctorStep]
    @property
    def first_fitting_step(self) -> Optional[DoctorStep]: ...
    def _repr_html_(self) -> str: ...

class TrainReport(_Json):
    model: ModelInfo
    workload: Record
    runtime_profile: str
    peak_bytes: int
    phase: str
    at_peak: Dict[str, int]
    gpu: GpuFit
    speed: Optional[Speed]
    phase_peaks: Optional[Dict[str, int]]
    distributed: Optional[Record]
    ranks: Optional[List[Record]]
    doctor: Optional[DoctorReport]
    @property
    def fits(self) -> bool: ...
    def _repr_html_(self) -> str: ...

class InferReport(_Json):
    model: ModelInfo
    workload: Record
    weights_from: str
    runtime_profile: str
    peak_bytes: int
    phase: str
    at_peak: Dict[str, int]
    weights_bytes: int
    kv_cache_bytes: int
    prefill_peak_bytes: int
    gpu: GpuFit
    doctor: Optional[DoctorReport]
    @property
    def fits(self) -> bool: ...
    def _repr_html_(self) -> str: ...

class ServeReport(_Json):
    model: ModelInfo
    gpu: str
    runtime_profile: str
    config: Record
    weights_from: str
    estimated_inputs: List[str]
    requested_memory_bytes: int
    available_kv_bytes: int
    num_kv_heads_per_rank: int
    groups: List[Record]
    bytes_per_block: int
    num_gpu_blocks: int
    kv_tokens: int
    fits_max_model_len: bool
    max_model_len_that_fits: int
    state_cache: Optional[Record]
    max_concurrency: Dict[str, float]
    fragmentation: List[Record]
    vllm_serve_command: str
    def _repr_html_(self) -> str: ...

class RooflineReport(_Json):
    model: ModelInfo
    gpu: str
    workload: Record
    ridge_flops_per_byte: float
    ops: List[Record]
    total_flops: float
    total_bytes: float
    time_s: float
    tokens_per_s: float
    decode: Optional[Record]
    def _repr_html_(self) -> str: ...

class Plan(_Json):
    rank: int
    fits: bool
    peak_bytes: int
    headroom_bytes: int
    host_bytes_per_node: int
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    breakdown: Dict[str, float]
    layout: Record
    micro_batch: int
    grad_accum: int
    seq: int
    checkpointing: bool
    precision: str
    optimizer: str
    lora_rank: Optional[int]
    qlora: bool
    changes_result: List[str]
    train_args: List[str]
    @property
    def command(self) -> str: ...
    @property
    def kwargs(self) -> Dict[str, Any]: ...

class PlanReport(_Json):
    model: ModelInfo
    asked: Record
    plans: List[Plan]
    fitting: int
    candidates_evaluated: int
    search_space: Record
    would_fit_with: Optional[List[Record]]
    @property
    def best(self) -> Optional[Plan]: ...
    def _repr_html_(self) -> str: ...

class InspectReport(_Json):
    model: ModelInfo
    checkpoint_dtype: Optional[str]
    params: Dict[str, int]
    bytes_by_dtype: Dict[str, int]
    checkpoint: Optional[Dict[str, Any]]

class ModelEntry(_Json):
    id: str
    hf_repo: str
    model_type: str
    params_total: int
    published_params: Optional[str]
    source: str

class GpuSpec(_Json):
    id: str
    name: str
    vendor: str
    architecture: str
    memory_bytes: int
    memory_type: str
    memory_bandwidth_bytes_per_s: float
    l2_bytes: Optional[int]
    peak_flops_per_s: Dict[str, float]
    interconnect: Optional[Record]
    pcie: Optional[Record]
    network_bytes_per_s: Optional[float]
    matmul_efficiency: Optional[float]
    tdp_w: Optional[int]
    sources: List[str]

def format_bytes(n: Optional[float]) -> str: ...
def train(
    model: Optional[ModelArg] = ...,
    *,
    batch: Optional[int] = ...,
    seq: Optional[int] = ...,
    precision: Optional[str] = ...,
    optimizer: Optional[str] = ...,
    checkpointing: Optional[bool] = ...,
    checkpointing_policy: Optional[str] = ...,
    attention: Optional[str] = ...,
    lora_rank: Optional[int] = ...,
    lora_targets: Union[str, Sequence[str], None] = ...,
    qlora: Optional[bool] = ...,
    grad_accum: Optional[int] = ...,
    dropout: Optional[bool] = ...,
    loss: Optional[str] = ...,
    padding_free: Optional[bool] = ...,
    loop: Optional[str] = ...,
    use_cache: Optional[bool] = ...,
    kernels: Optional[str] = ...,
    train_vision: Optional[bool] = ...,
    image_tokens: Optional[int] = ...,
    gpu: Optional[str] = ...,
    matmul_efficiency: Optional[float] = ...,
    bandwidth_efficiency: Optional[float] = ...,
    alloc_margin: Optional[float] = ...,
    gpus: Optional[int] = ...,
    gpus_per_node: Optional[int] = ...,
    strategy: Optional[str] = ...,
    tp: Optional[int] = ...,
    sequence_parallel: Optional[bool] = ...,
    pp: Optional[int] = ...,
    schedule: Optional[str] = ...,
    virtual_stages: Optional[int] = ...,
    cp: Optional[int] = ...,
    ep: Optional[int] = ...,
    offload: Optional[str] = ...,
    offload_device: Optional[str] = ...,
    global_batch: Optional[int] = ...,
    runtime: Optional[str] = ...,
    activation_offload: Optional[bool] = ...,
    float8: Optional[str] = ...,
    float8_all_gather: Optional[bool] = ...,
) -> TrainReport: ...
def doctor(
    model: Optional[ModelArg] = ...,
    *,
    batch: Optional[int] = ...,
    seq: Optional[int] = ...,
    precision: Optional[str] = ...,
    optimizer: Optional[str] = ...,
    checkpointing: Optional[bool] = ...,
    checkpointing_policy: Optional[str] = ...,
    attention: Optional[str] = ...,
    lora_rank: Optional[int] = ...,
    lora_targets: Union[str, Sequence[str], None] = ...,
    qlora: Optional[bool] = ...,
    grad_accum: Optional[int] = ...,
    dropout: Optional[bool] = ...,
    loss: Optional[str] = ...,
    padding_free: Optional[bool] = ...,
    loop: Optional[str] = ...,
    use_cache: Optional[bool] = ...,
    kernels: Optional[str] = ...,
    train_vision: Optional[bool] = ...,
    image_tokens: Optional[int] = ...,
    gpu: Optional[str] = ...,
    matmul_efficiency: Optional[float] = ...,
    bandwidth_efficiency: Optional[float] = ...,
    alloc_margin: Optional[float] = ...,
    gpus: Optional[int] = ...,
    gpus_per_node: Optional[int] = ...,
    strategy: Optional[str] = ...,
    tp: Optional[int] = ...,
    sequence_parallel: Optional[bool] = ...,
    pp: Optional[int] = ...,
    schedule: Optional[str] = ...,
    virtual_stages: Optional[int] = ...,
    cp: Optional[int] = ...,
    ep: Optional[int] = ...,
    offload: Optional[str] = ...,
    offload_device: Optional[str] = ...,
    global_batch: Optional[int] = ...,
    runtime: Optional[str] = ...,
    activation_offload: Optional[bool] = ...,
    float8: Optional[str] = ...,
    float8_all_gather: Optional[bool] = ...,
) -> DoctorReport: ...
def infer(
    model: Optional[ModelArg] = ...,
    *,
    image_tokens: Optional[int] = ...,
    batch: Optional[int] = ...,
    prompt: Optional[int] = ...,
    new_tokens: Optional[int] = ...,
    attention: Optional[str] = ...,
    weights: Optional[str] = ...,
    kv_dtype: Optional[str] = ...,
    gpu: Optional[str] = ...,
    moe_grouped_decode: Optional[bool] = ...,
    alloc_margin: Optional[float] = ...,
) -> InferReport: ...
def doctor_infer(
    model: Optional[ModelArg] = ...,
    *,
    image_tokens: Optional[int] = ...,
    batch: Optional[int] = ...,
    prompt: Optional[int] = ...,
    new_tokens: Optional[int] = ...,
    attention: Optional[str] = ...,
    weights: Optional[str] = ...,
    kv_dtype: Optional[str] = ...,
    gpu: Optional[str] = ...,
    moe_grouped_decode: Optional[bool] = ...,
    alloc_margin: Optional[float] = ...,
) -> DoctorReport: ...
def serve(
    model: Optional[ModelArg] = ...,
    *,
    gpu: Optional[str] = ...,
    tp: Optional[int] = ...,
    gpu_memory_utilization: Optional[float] = ...,
    kv_cache_dtype: Optional[str] = ...,
    quantization: Optional[str] = ...,
    weights: Optional[str] = ...,
    block_size: Optional[int] = ...,
    max_model_len: Optional[int] = ...,
    max_num_batched_tokens: Optional[int] = ...,
    max_num_seqs: Optional[int] = ...,
    enforce_eager: Optional[bool] = ...,
    kv_cache_memory_bytes: Optional[int] = ...,
    non_torch_bytes: Optional[int] = ...,
    activation_bytes: Optional[int] = ...,
    cuda_graph_bytes: Optional[int] = ...,
    enable_prefix_caching: Optional[bool] = ...,
    request_lengths: Union[str, Sequence[int], None] = ...,
) -> ServeReport: ...
def roofline(
    model: Optional[ModelArg] = ...,
    *,
    gpu: Optional[str] = ...,
    phase: Optional[str] = ...,
    batch: Optional[int] = ...,
    seq: Optional[int] = ...,
    dtype: Optional[str] = ...,
    tp: Optional[int] = ...,
    flops_efficiency: Optional[float] = ...,
    bandwidth_efficiency: Optional[float] = ...,
    svg: Union[str, os.PathLike[str], None] = ...,
) -> RooflineReport: ...
def plan(
    model: Optional[ModelArg] = ...,
    *,
    gpu: Optional[str] = ...,
    gpus: Optional[int] = ...,
    gpus_per_node: Optional[int] = ...,
    seq: Optional[int] = ...,
    global_batch: Optional[int] = ...,
    host_memory_per_node: Optional[int] = ...,
    allow: Union[str, Sequence[str], None] = ...,
    max_step_s: Optional[float] = ...,
    top: Optional[int] = ...,
    precision: Optional[str] = ...,
    optimizer: Optional[str] = ...,
    attention: Optional[str] = ...,
    loss: Optional[str] = ...,
    checkpointing_policy: Optional[str] = ...,
    loop: Optional[str] = ...,
    use_cache: Optional[bool] = ...,
    kernels: Optional[str] = ...,
    dropout: Optional[bool] = ...,
    lora_rank: Optional[int] = ...,
    lora_targets: Union[str, Sequence[str], None] = ...,
    alloc_margin: Optional[float] = ...,
    runtime: Optional[str] = ...,
) -> PlanReport: ...
def inspect(model: ModelArg) -> InspectReport: ...
def models() -> List[ModelEntry]: ...
def gpus() -> List[GpuSpec]: ...
def training_args_kwargs(
    training_args: Any,
    model_config: Any = ...,
    *,
    module: Any = ...,
    model_dtype: Any = ...,
    **overrides: Any,
) -> Dict[str, Any]: ...
def from_training_args(
    training_args: Any,
    model_config: Any = ...,
    *,
    module: Any = ...,
    model_dtype: Any = ...,
    **overrides: Any,
) -> TrainReport: ...

class MemwallCallback:
    """A transformers.TrainerCallback (defined when first used; needs transformers)."""

    model_config: Any
    gpu: Optional[str]
    strict: bool
    overrides: Dict[str, Any]
    report: Optional[TrainReport]
    def __init__(
        self,
        model_config: Any = ...,
        gpu: Optional[str] = ...,
        *,
        strict: bool = ...,
        **overrides: Any,
    ) -> None: ...
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
