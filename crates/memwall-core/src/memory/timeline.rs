//! The allocation timeline and a miniature autograd engine replaying PyTorch's.
//!
//! Semantics follow PyTorch's eager autograd (`torch/csrc/autograd/engine.cpp`):
//! a forward op records a node holding its *saved tensors*; backward runs nodes in reverse
//! creation order; a node's backward allocates the gradients of its inputs, releases the
//! gradient of its outputs, sums a second gradient for the same tensor out of place
//! (`InputBuffer::accumulate`), then releases its saved tensors. A tensor's storage is freed when the last
//! Python reference and the last saved reference are gone — exactly what a caching-allocator
//! tracker (`torch.cuda.max_memory_allocated`, MemTracker) counts.

use serde::Serialize;

/// What a live byte is, for the breakdown at the peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model parameters (frozen or trainable).
    Weights,
    /// Registered buffers (rotary tables, …).
    Buffers,
    /// `.grad` of trainable parameters.
    Gradients,
    /// Optimizer states (moments, step counters, master copies).
    OptimizerStates,
    /// Forward tensors: saved for backward or still referenced by the forward code.
    Activations,
    /// Logits, their fp32 upcast and the log-softmax of the loss.
    LossBuffers,
    /// Backward temporaries and gradients of activations.
    Temporaries,
    /// Temporaries of the optimizer step (e.g. foreach AdamW's `exp_avg_sq.sqrt()` list).
    OptimizerTemporaries,
    /// Communication buffers of data parallelism (FSDP all-gather / reduce-scatter buffers,
    /// DDP and DeepSpeed gradient buckets).
    CommBuffers,
}

impl Category {
    /// All categories in report order.
    pub const ALL: [Category; 9] = [
        Category::Weights,
        Category::Buffers,
        Category::Gradients,
        Category::OptimizerStates,
        Category::Activations,
        Category::LossBuffers,
        Category::Temporaries,
        Category::OptimizerTemporaries,
        Category::CommBuffers,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Phase of the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Embeddings and decoder layers.
    Forward,
    /// Final norm, LM head and cross-entropy.
    Loss,
    /// `loss.backward()`.
    Backward,
    /// `optimizer.step()`.
    Optimizer,
    /// Inference: the prompt's forward.
    Prefill,
    /// Inference: one-token forwards with the KV cache.
    Decode,
}

/// Index of a tensor in the timeline (32 bits keep the tape's records small).
pub type TensorId = u32;

#[derive(Debug, Clone)]
struct TensorRec {
    bytes: u128,
    category: Category,
    refs: u32,
    live: bool,
    requires_grad: bool,
    /// Gradient buffer of this activation during backward.
    grad: Option<TensorId>,
    /// For parameters: whether it is trainable, and its persistent `.grad`.
    param: Option<ParamState>,
    /// For a view ([`Timeline::view`]): the tensor whose storage it shares and keeps alive.
    base: Option<TensorId>,
}

#[derive(Debug, Clone, Copy)]
struct ParamState {
    trainable: bool,
    grad: Option<TensorId>,
    /// Bytes of the gradient (= parameter bytes; differs only for autocast casts).
    grad_bytes: u128,
    /// Recorded nodes that will still send a gradient to this parameter in this backward.
    uses: u32,
    /// Gradients received so far, summed in AccumulateGrad's input buffer.
    pending: Option<TensorId>,
}

/// A short inline list of tensor ids (no heap allocation per node).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ids {
    ids: [TensorId; 6],
    len: u8,
}

impl Ids {
    /// Copies up to six ids (autograd nodes here never hold more).
    pub fn of(ids: &[TensorId]) -> Self {
        debug_assert!(ids.len() <= 6, "a node holds at most six tensors");
        let mut out = Ids::default();
        for &id in ids.iter().take(6) {
            out.ids[out.len as usize] = id;
            out.len += 1;
        }
        out
    }

    /// Appends an id (up to six; more are ignored, as in [`Ids::of`]).
    #[inline]
    pub fn push(&mut self, id: TensorId) {
        debug_assert!(self.len < 6, "a node holds at most six tensors");
        if let Some(slot) = self.ids.get_mut(self.len as usize) {
            *slot = id;
            self.len += 1;
        }
    }

    /// The ids.
    #[inline]
    pub fn as_slice(&self) -> &[TensorId] {
        // (`len` never exceeds six: the bound only spares the slice its check)
        &self.ids[..usize::from(self.len).min(6)]
    }
}

/// A recorded autograd node.
#[derive(Debug, Clone, Copy, Default)]
pub struct Node {
    /// Tensors saved for backward (a reference each).
    pub saved: Ids,
    /// Activation inputs that need a gradient.
    pub inputs: Ids,
    /// Parameters whose gradient this node produces.
    pub params: Ids,
    /// Outputs whose gradient this node consumes.
    pub outputs: Ids,
    /// Transient bytes of the backward formula, allocated before the input gradients and
    /// freed right after them.
    pub backward_temps: u128,
    /// When set, this node stands for a checkpointed segment to recompute first.
    pub recompute: Option<usize>,
    /// When set, this is not an op but a data-parallel hook point (FSDP/ZeRO unit boundary).
    pub marker: Option<Marker>,
    /// The node's gradients already exist: the k-th gradient it produces (inputs first, then
    /// parameters) is the k-th saved tensor, handed on without a new allocation. Fused kernels
    /// that write a gradient in place (flash-attn's cross-entropy over the logits' storage) or
    /// compute it in the forward (Liger's fused linear cross-entropy) work like this.
    pub grads_in_saved: bool,
    /// When set, this node stands for a checkpointed core attention to recompute first (the
    /// simulator's index of the call).
    pub recompute_attention: Option<u32>,
    /// When set, this node stands for a checkpointed vision-tower block to recompute first
    /// (the block's index; memory/hf/vision.rs).
    pub recompute_vision: Option<u32>,
    /// This node is a grad-requiring leaf's AccumulateGrad (its one output is the leaf): the
    /// gradient it receives becomes the leaf's `.grad`, and the node, which holds the leaf
    /// (`torch/csrc/autograd/functions/accumulate_grad.h`: `Variable variable`), lives on in
    /// the graph until the graph is freed, so leaf and gradient stay allocated until then.
    pub leaf_keeps_grad: bool,
    /// The gradient of the first input is the first output's gradient tensor itself, rewritten
    /// in place (Liger's RMSNorm writes `dX` over `dY`): handed on, no allocation.
    pub input_grad_is_output_grad: bool,
    /// Every input's gradient is the output's gradient itself where the two have the same
    /// bytes (same dtype and shape): `AddBackward0` returns `grad` for both operands
    /// (tools/autograd/derivatives.yaml `add.Tensor`: `handle_r_to_c(self, grad)`,
    /// `maybe_multiply(grad, alpha)` with alpha 1), so the residual add's branches share one
    /// tensor. An input of another dtype (autocast's fp32 + 16-bit) or a broadcast one gets its
    /// own (`validate_outputs` casts or reduces it).
    pub input_grads_alias_output: bool,
    /// The parameter gradients leave this node in the compute dtype (`backward_temps` holds
    /// them) and the parameter's autocast cast converts them in its own `ToCopyBackward` node,
    /// which runs after this node has released its incoming gradients and saved tensors
    /// (`Engine::evaluate_function`, torch/csrc/autograd/engine.cpp: `call_function` consumes
    /// the inputs and calls `release_variables` before the outputs reach the next nodes).
    pub param_grads_cast: bool,
    /// Activation offloading: the bytes of the tensors this node saved, copied to host memory
    /// when it was recorded (its `saved` is then empty) and copied back to the device while its
    /// backward runs.
    pub offloaded: u128,
}

impl Node {
    /// The node holds no tensor for its backward: nothing saved (or offloaded), no parameter
    /// (a linear's node saves its weight even when it needs no gradient), and it is an
    /// ordinary op, not a hook point, a recompute or a leaf. Under non-reentrant checkpointing
    /// such nodes at a layer's end run before the recompute: it starts when the first node
    /// unpacks a saved tensor (torch 2.15 `torch/utils/checkpoint.py`, `unpack_hook` of
    /// `_checkpoint_hook`).
    pub fn saves_nothing(&self) -> bool {
        self.saved.as_slice().is_empty()
            && self.params.as_slice().is_empty()
            && self.offloaded == 0
            && self.marker.is_none()
            && self.recompute.is_none()
            && self.recompute_attention.is_none()
            && self.recompute_vision.is_none()
            && !self.grads_in_saved
            && !self.leaf_keeps_grad
    }
}

/// A hook point on the tape: backward reaches it like an op and the simulator runs the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Recorded where a unit's forward ends: its backward starts here (FSDP `pre_backward`).
    PreBackward(usize),
    /// Recorded where a unit's forward starts: its backward is done here (FSDP `post_backward`).
    PostBackward(usize),
}

/// What part of the step a segment of the timeline is (see [`Segment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegKind {
    /// Outside any decoder layer (embeddings, loss, optimizer, …).
    Fixed,
    /// A decoder layer's forward (with its sharding hooks).
    Forward,
    /// A decoder layer's backward, from its `PreBackward` hook point.
    BackwardStart,
    /// After a decoder layer's `PostBackward` hook point (its post-backward hooks).
    BackwardEnd,
    /// Inference: a layer's cache carried over skipped decode steps.
    CacheJump,
}

/// Where a segment sits in the replay: the decoder-layer slot it belongs to, and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegTag {
    /// Decoder-layer slot (`None` outside the layers).
    pub slot: Option<u32>,
    /// What part of the step.
    pub kind: SegKind,
}

impl SegTag {
    /// Outside the layers.
    pub const FIXED: SegTag = SegTag {
        slot: None,
        kind: SegKind::Fixed,
    };
}

/// A stretch of the timeline between two cuts, summarised by its highest live bytes (the first
/// instant reaching them) — what the fast evaluator (`memory/fast.rs`) needs of a replay: the
/// step's peak is the first highest of them, a phase's peak the highest of its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    /// Where it sits.
    pub tag: SegTag,
    /// Its phase (a phase change cuts a segment).
    pub phase: Phase,
    /// A phase-boundary instant: counts towards its phase's peak, never the step's (the live
    /// bytes there were reached before).
    pub instant: bool,
    /// Whether anything was allocated in it (else `max` and `at` mean nothing).
    pub hit: bool,
    /// Highest live bytes.
    pub max: u128,
    /// Live bytes by category at the first instant reaching `max`.
    pub at: [u128; 9],
}

impl Segment {
    fn open(tag: SegTag, phase: Phase) -> Self {
        Segment {
            tag,
            phase,
            instant: false,
            hit: false,
            max: 0,
            at: [0; 9],
        }
    }
}

/// Timelines kept for reuse per thread (a replay holds one at a time; the fast evaluator's
/// reduced replays run one after the other).
const SPARE_TIMELINES: usize = 2;

/// Records a spare timeline keeps room for (a reduced replay needs a few thousand).
const SPARE_RECORDS: usize = 1 << 14;

thread_local! {
    static SPARE: std::cell::RefCell<Vec<Timeline>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The live-bytes timeline with its peak.
#[derive(Debug, Clone)]
pub struct Timeline {
    tensors: Vec<TensorRec>,
    /// The parameters' ids in creation order (what `zero_grad` visits, instead of every
    /// tensor record).
    params: Vec<TensorId>,
    live: u128,
    by_category: [u128; 9],
    peak: u128,
    peak_by_category: [u128; 9],
    peak_phase: Phase,
    phase: Phase,
    /// Peak live bytes within each phase (indexed by `Phase as usize`) since the last reset.
    phase_peaks: [u128; 6],
    /// The autograd tape.
    pub tape: Vec<Node>,
    /// While false, forward ops record nothing (inside a checkpointed segment).
    pub recording: bool,
    /// Allocation granularity: CUDA's caching allocator rounds every block up to 512 bytes
    /// (`c10/cuda/CUDACachingAllocator.cpp`, `kMinBlockSize`, `round_size`); 1 = exact.
    pub granularity: u128,
    /// The peak's breakdown is `by_category` (not copied yet: nothing has changed since).
    peak_pending: bool,
    /// The current segment's breakdown at its maximum is `by_category` (not copied yet).
    seg_pending: bool,
    /// Segments are recorded (fast evaluator). The fast evaluator reads the segments only, so
    /// while they are recorded the step's own peaks (`peak`, its breakdown and phase, and the
    /// phases' peaks) are not kept: the segments' maxima say the same.
    segmenting: bool,
    /// The segment being recorded.
    seg: Segment,
    /// Closed segments since the last [`Timeline::reset_peak`].
    segments: Vec<Segment>,
    /// Activation offloading to host memory (`save_on_cpu`).
    pub host: HostOffload,
    /// While set (a checkpointed layer's first pass, which records nothing): the nodes that
    /// pass would have recorded since the last one that saves a tensor ([`Node::saves_nothing`]),
    /// in order — the layer's last ops, which backward runs before the recompute.
    tail: Option<Vec<Node>>,
    /// The nodes the tracked first pass recorded that save a tensor (or stand for ops that do).
    tail_saving: u32,
    /// A checkpointed layer's recompute: the saving nodes still to record before it stops
    /// ([`Timeline::stop_after`]).
    stop: Option<u32>,
    /// The recompute has stopped: what the layer's code allocates from now on is never made.
    stopped: bool,
    /// The peak's state before the last allocation, kept while the next saving node is the
    /// recompute's last (its output may never have been made: [`Timeline::record`]).
    snap: Option<PeakSnap>,
}

/// The peak's state before one allocation (`Timeline::snap`).
#[derive(Debug, Clone, Copy)]
struct PeakSnap {
    id: TensorId,
    peak: u128,
    peak_by_category: [u128; 9],
    peak_pending: bool,
    peak_phase: Phase,
    phase_peaks: [u128; 6],
    seg: Segment,
    seg_pending: bool,
}

/// Activation offloading to host memory: `torch.autograd.graph.save_on_cpu(pin_memory=True)`
/// (torch/autograd/graph.py). While `active`, every tensor a recorded node saves is packed into
/// a new host tensor of its size (`pack_to_cpu`: `torch.empty(..., pin_memory=True).copy_(t)`),
/// so the node keeps no reference on the device tensor; when the node's backward runs, each is
/// unpacked by a copy back to the device (`unpack_from_cpu`: `tensor.to(device)`), alive while
/// the node's backward runs, and the host copy goes with the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostOffload {
    /// Saved tensors are packed to host memory now.
    pub active: bool,
    /// Host bytes the packed copies hold.
    pub live: u128,
    /// The most host bytes held at once since the last [`Timeline::reset_peak`].
    pub peak: u128,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Timeline {
            tensors: Vec::with_capacity(4096),
            params: Vec::with_capacity(256),
            live: 0,
            by_category: [0; 9],
            peak: 0,
            peak_by_category: [0; 9],
            peak_phase: Phase::Forward,
            phase: Phase::Forward,
            phase_peaks: [0; 6],
            tape: Vec::with_capacity(2048),
            recording: true,
            granularity: 1,
            peak_pending: false,
            seg_pending: false,
            segmenting: false,
            seg: Segment::open(SegTag::FIXED, Phase::Forward),
            segments: Vec::new(),
            host: HostOffload::default(),
            tail: None,
            tail_saving: 0,
            stop: None,
            stopped: false,
            snap: None,
        }
    }

    /// A timeline with no buffers yet (allocates nothing).
    pub(crate) fn empty() -> Self {
        Timeline {
            tensors: Vec::new(),
            params: Vec::new(),
            live: 0,
            by_category: [0; 9],
            peak: 0,
            peak_by_category: [0; 9],
            peak_phase: Phase::Forward,
            phase: Phase::Forward,
            phase_peaks: [0; 6],
            tape: Vec::new(),
            recording: true,
            granularity: 1,
            peak_pending: false,
            seg_pending: false,
            segmenting: false,
            seg: Segment::open(SegTag::FIXED, Phase::Forward),
            segments: Vec::new(),
            host: HostOffload::default(),
            tail: None,
            tail_saving: 0,
            stop: None,
            stopped: false,
            snap: None,
        }
    }

    /// A cleared timeline whose buffers earlier replays on this thread grew (the replay's
    /// arena: its tensor and tape records are reused, not reallocated); a new one when none
    /// is spare.
    pub(crate) fn pooled() -> Self {
        SPARE
            .with(|p| p.try_borrow_mut().ok().and_then(|mut v| v.pop()))
            .unwrap_or_default()
    }

    /// Gives the buffers back for the next replay on this thread (trimmed, so a replay of
    /// thousands of layers does not keep its memory for good).
    pub(crate) fn recycle(mut self) {
        if self.tensors.capacity() == 0 {
            return;
        }
        self.clear();
        self.tensors.shrink_to(SPARE_RECORDS);
        self.params.shrink_to(SPARE_RECORDS);
        self.tape.shrink_to(SPARE_RECORDS);
        self.segments.shrink_to(SPARE_RECORDS);
        SPARE.with(|p| {
            if let Ok(mut v) = p.try_borrow_mut() {
                if v.len() < SPARE_TIMELINES {
                    v.push(self);
                }
            }
        });
    }

    /// Empties the timeline for another replay, keeping its buffers.
    pub(crate) fn clear(&mut self) {
        self.tensors.clear();
        self.params.clear();
        self.tape.clear();
        self.segments.clear();
        self.live = 0;
        self.by_category = [0; 9];
        self.peak = 0;
        self.peak_by_category = [0; 9];
        self.peak_phase = Phase::Forward;
        self.phase = Phase::Forward;
        self.phase_peaks = [0; 6];
        self.recording = true;
        self.granularity = 1;
        self.peak_pending = false;
        self.seg_pending = false;
        self.segmenting = false;
        self.seg = Segment::open(SegTag::FIXED, Phase::Forward);
        self.host = HostOffload::default();
        self.tail = None;
        self.tail_saving = 0;
        self.stop = None;
        self.stopped = false;
        self.snap = None;
    }

    /// Records segments from now on.
    pub(crate) fn start_segments(&mut self) {
        self.segmenting = true;
    }

    /// Whether segments are recorded.
    pub(crate) fn segmenting(&self) -> bool {
        self.segmenting
    }

    /// Closes the current segment and opens one tagged `tag` (when recording segments).
    pub(crate) fn cut(&mut self, tag: SegTag) {
        if self.segmenting {
            self.settle();
            self.segments.push(self.seg);
            self.seg = Segment::open(tag, self.phase);
        }
    }

    /// Closes the current segment; the segments since the last reset, in time order.
    pub(crate) fn finish_segments(&mut self) -> &[Segment] {
        if self.segmenting {
            self.settle();
            self.segments.push(self.seg);
            self.seg = Segment::open(self.seg.tag, self.phase);
        }
        &self.segments
    }

    /// [`Timeline::finish_segments`] handed over without a copy: `out` (emptied) receives
    /// the segments and the timeline keeps `out`'s buffer for any segments after.
    pub(crate) fn take_segments(&mut self, out: &mut Vec<Segment>) {
        self.finish_segments();
        out.clear();
        std::mem::swap(out, &mut self.segments);
    }

    /// Sets the current phase.
    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        let p = &mut self.phase_peaks[phase as usize];
        *p = (*p).max(self.live);
        if self.segmenting {
            self.settle();
            let tag = self.seg.tag;
            self.segments.push(self.seg);
            self.segments.push(Segment {
                instant: true,
                hit: true,
                max: self.live,
                at: self.by_category,
                ..Segment::open(tag, phase)
            });
            self.seg = Segment::open(tag, phase);
        }
    }

    /// Peak live bytes within `phase` since the last [`Timeline::reset_peak`].
    pub fn phase_peak(&self, phase: Phase) -> u128 {
        debug_assert!(
            !self.segmenting,
            "phase peaks are not kept while segmenting"
        );
        self.phase_peaks[phase as usize]
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Copies the breakdown at the latest maxima, before `by_category` changes. A new maximum
    /// only marks its breakdown as pending: until a free or a retag, every allocation makes a
    /// new maximum, so the breakdown is copied once per local maximum, not per allocation.
    #[inline]
    fn settle(&mut self) {
        if self.peak_pending || self.seg_pending {
            self.settle_copy();
        }
    }

    /// The copies of [`Timeline::settle`], apart (once per local maximum: the frees that
    /// call `settle` rarely find one pending, and keep their registers for themselves).
    #[cold]
    #[inline(never)]
    fn settle_copy(&mut self) {
        if self.peak_pending {
            self.peak_pending = false;
            self.peak_by_category = self.by_category;
        }
        if self.seg_pending {
            self.seg_pending = false;
            self.seg.at = self.by_category;
        }
    }

    /// `bytes` rounded up to the allocation granularity.
    #[inline]
    fn round(&self, bytes: u128) -> u128 {
        let g = self.granularity;
        // the two granularities replays use, with constant divisors
        if g == 1 {
            return bytes;
        }
        if g == 512 {
            return bytes.next_multiple_of(512);
        }
        if g.is_power_of_two() {
            bytes.next_multiple_of(g)
        } else {
            bytes.div_ceil(g) * g
        }
    }

    #[inline]
    fn add_live(&mut self, bytes: u128, cat: Category) {
        // Adding nothing changes nothing (the peaks are never below the live bytes), except
        // that it opens a segment's first instant when none was reached yet.
        if bytes == 0 && (!self.segmenting || self.seg.hit) {
            return;
        }
        self.live += bytes;
        self.by_category[cat.index()] += bytes;
        if self.segmenting {
            if !self.seg.hit || self.live > self.seg.max {
                self.seg.hit = true;
                self.seg.max = self.live;
                self.seg_pending = true;
            }
            return;
        }
        let p = &mut self.phase_peaks[self.phase as usize];
        *p = (*p).max(self.live);
        if self.live > self.peak {
            self.peak = self.live;
            self.peak_pending = true;
            self.peak_phase = self.phase;
        }
    }

    #[inline]
    fn sub_live(&mut self, bytes: u128, cat: Category) {
        // Freeing nothing leaves `by_category` as it is, so a pending breakdown can wait for
        // the next change.
        if bytes == 0 {
            return;
        }
        self.settle();
        self.live -= bytes;
        self.by_category[cat.index()] -= bytes;
    }

    /// Allocates a tensor with one (Python) reference.
    #[inline(always)]
    pub fn alloc(&mut self, bytes: u128, category: Category, requires_grad: bool) -> TensorId {
        let bytes = self.round(bytes);
        let id = TensorId::try_from(self.tensors.len()).unwrap_or(TensorId::MAX);
        let live = !self.stopped;
        self.tensors.push(TensorRec {
            bytes,
            category,
            refs: 1,
            live,
            requires_grad,
            grad: None,
            param: None,
            base: None,
        });
        if self.stop == Some(1) {
            self.snap_peak(id);
        }
        if live {
            self.add_live(bytes, category);
        }
        id
    }

    /// Keeps the peak's state before allocation `id` ([`Timeline::snap`]).
    #[cold]
    fn snap_peak(&mut self, id: TensorId) {
        self.snap = Some(PeakSnap {
            id,
            peak: self.peak,
            peak_by_category: self.peak_by_category,
            peak_pending: self.peak_pending,
            peak_phase: self.peak_phase,
            phase_peaks: self.phase_peaks,
            seg: self.seg,
            seg_pending: self.seg_pending,
        });
    }

    /// Under non-reentrant checkpointing's early stop (torch 2.15 `torch/utils/checkpoint.py`,
    /// `early_stop=True` by default, which HF's gradient checkpointing keeps): the recompute
    /// packs the tensors its ops save and raises `_StopRecomputationError` in the pack hook
    /// of the last one the first pass saved, so nothing after that op runs — not even its own
    /// output when it saves only its inputs (packed before it computes) — and the
    /// recomputation's locals go as the exception unwinds. The layer's code goes on, but
    /// allocates nothing after the `saving`-th node that saves a tensor.
    pub(crate) fn stop_after(&mut self, saving: u32) {
        self.stop = (saving > 0).then_some(saving);
        self.stopped = false;
        self.snap = None;
    }

    /// The recomputed layer has returned: allocations count again. Whether it had stopped.
    pub(crate) fn end_stop(&mut self) -> bool {
        let stopped = self.stopped || self.stop.is_none();
        self.stop = None;
        self.stopped = false;
        self.snap = None;
        stopped
    }

    /// The recompute's last saving node: the recompute stops at its pack hook, so an output it
    /// does not save was never made (its allocation, the last one, is taken back with the
    /// peak it may have raised).
    #[cold]
    fn stop_at(&mut self, node: &Node) {
        self.stop = None;
        self.stopped = true;
        let snap = self.snap.take();
        for &o in node.outputs.as_slice() {
            if node.saved.as_slice().contains(&o) {
                continue;
            }
            let t = &mut self.tensors[o as usize];
            if !t.live {
                continue;
            }
            t.live = false;
            let (b, c) = (t.bytes, t.category);
            self.settle();
            self.live -= b;
            self.by_category[c.index()] -= b;
            if let Some(s) = snap.filter(|s| s.id == o && s.seg.tag == self.seg.tag) {
                self.peak = s.peak;
                self.peak_by_category = s.peak_by_category;
                self.peak_pending = s.peak_pending;
                self.peak_phase = s.peak_phase;
                self.phase_peaks = s.phase_peaks;
                self.seg = s.seg;
                self.seg_pending = s.seg_pending;
            }
        }
    }

    /// A view of `base` (`chunk`, `split`): no storage of its own, one reference on `base` for as
    /// long as the view lives, and a gradient of its own `bytes` (a split's backward receives
    /// one gradient per piece and concatenates them into the base's gradient,
    /// `split_backward` in torch/csrc/autograd/FunctionsManual.cpp).
    pub fn view(&mut self, base: TensorId, bytes: u128, requires_grad: bool) -> TensorId {
        let bytes = self.round(bytes);
        let category = self.tensors[base as usize].category;
        self.retain(base);
        let id = TensorId::try_from(self.tensors.len()).unwrap_or(TensorId::MAX);
        self.tensors.push(TensorRec {
            bytes,
            category,
            refs: 1,
            live: false,
            requires_grad,
            grad: None,
            param: None,
            base: Some(base),
        });
        id
    }

    /// Allocates a parameter (never freed).
    pub fn param(&mut self, bytes: u128, trainable: bool) -> TensorId {
        let id = self.alloc(bytes, Category::Weights, trainable);
        self.tensors[id as usize].param = Some(ParamState {
            trainable,
            grad: None,
            grad_bytes: bytes,
            uses: 0,
            pending: None,
        });
        self.params.push(id);
        id
    }

    /// Frees a parameter's storage while keeping its identity (FSDP/ZeRO-3 reshard).
    pub fn evict_param(&mut self, id: TensorId) {
        if self.tensors[id as usize].live {
            self.tensors[id as usize].live = false;
            let (b, c) = (
                self.tensors[id as usize].bytes,
                self.tensors[id as usize].category,
            );
            self.sub_live(b, c);
        }
    }

    /// Re-materialises an evicted parameter (FSDP/ZeRO-3 all-gather copy-out).
    pub fn restore_param(&mut self, id: TensorId) {
        if !self.tensors[id as usize].live {
            self.tensors[id as usize].live = true;
            let (b, c) = (
                self.tensors[id as usize].bytes,
                self.tensors[id as usize].category,
            );
            self.add_live(b, c);
        }
    }

    /// Whether a tensor's storage is allocated.
    pub fn is_live(&self, id: TensorId) -> bool {
        self.tensors[id as usize].live
    }

    /// Takes a parameter's `.grad` away (the caller now owns its reference).
    pub fn take_param_grad(&mut self, p: TensorId) -> Option<TensorId> {
        self.tensors[p as usize]
            .param
            .as_mut()
            .and_then(|s| s.grad.take())
    }

    /// Changes the stored size of a parameter (quantised storage); it must be live.
    pub fn resize_param(&mut self, id: TensorId, bytes: u128) {
        let old = self.tensors[id as usize].bytes;
        let cat = self.tensors[id as usize].category;
        self.sub_live(old, cat);
        self.tensors[id as usize].bytes = bytes;
        self.add_live(bytes, cat);
    }

    /// Sets the size of a parameter's gradient (fp32 master weights under autocast keep fp32 grads).
    pub fn set_grad_bytes(&mut self, id: TensorId, bytes: u128) {
        if let Some(p) = self.tensors[id as usize].param.as_mut() {
            p.grad_bytes = bytes;
        }
    }

    /// Bytes of a parameter's gradient (0 for a tensor that is not a parameter).
    pub fn grad_bytes(&self, id: TensorId) -> u128 {
        self.tensors[id as usize].param.map_or(0, |p| p.grad_bytes)
    }

    /// Moves a live tensor to another category (e.g. logits to loss buffers).
    pub fn retag(&mut self, id: TensorId, category: Category) {
        if self.tensors[id as usize].live {
            self.settle();
            let t = &self.tensors[id as usize];
            let (b, old) = (t.bytes, t.category);
            self.by_category[old.index()] -= b;
            self.by_category[category.index()] += b;
        }
        self.tensors[id as usize].category = category;
    }

    /// Marks a tensor as requiring grad (`tensor.requires_grad_(True)`).
    pub fn set_requires_grad(&mut self, id: TensorId, requires_grad: bool) {
        self.tensors[id as usize].requires_grad = requires_grad;
    }

    /// Bytes of a tensor.
    pub fn bytes(&self, id: TensorId) -> u128 {
        self.tensors[id as usize].bytes
    }

    /// Whether a tensor requires grad.
    pub fn requires_grad(&self, id: TensorId) -> bool {
        self.tensors[id as usize].requires_grad
    }

    /// Adds a reference (a view kept by Python, a saved tensor).
    #[inline]
    pub fn retain(&mut self, id: TensorId) {
        self.tensors[id as usize].refs += 1;
    }

    /// Drops a reference; frees the storage at zero.
    #[inline]
    pub fn release(&mut self, id: TensorId) {
        // a view's last reference goes with its base's reference (a loop, not a recursion)
        let mut id = id;
        loop {
            let t = &mut self.tensors[id as usize];
            debug_assert!(t.refs > 0, "double release of tensor {id}");
            t.refs = t.refs.saturating_sub(1);
            if t.refs != 0 {
                return;
            }
            let base = t.base.take();
            if t.live {
                t.live = false;
                let (b, c) = (t.bytes, t.category);
                self.sub_live(b, c);
            }
            match base {
                Some(b) => id = b,
                None => return,
            }
        }
    }

    /// Starts collecting the nodes a checkpointed layer's unrecorded first pass ends with
    /// ([`Timeline::take_tail`]).
    pub(crate) fn start_tail(&mut self) {
        let mut tail = self.tail.take().unwrap_or_default();
        tail.clear();
        self.tail = Some(tail);
        self.tail_saving = 0;
    }

    /// Whether the nodes an unrecorded pass would record are being collected (a builder that
    /// skips building a node while not recording builds it then).
    pub(crate) fn tracking_tail(&self) -> bool {
        self.tail.is_some()
    }

    /// An op the unrecorded pass does not build a node for saves a tensor: the nodes before it
    /// are not the layer's last.
    pub(crate) fn tail_barrier(&mut self) {
        if let Some(tail) = self.tail.as_mut() {
            tail.clear();
            self.tail_saving += 1;
        }
    }

    /// Stops collecting and returns, in order, the nodes at the end of the pass that save
    /// nothing, and how many nodes of the pass save a tensor.
    pub(crate) fn take_tail(&mut self) -> (Vec<Node>, u32) {
        (self.tail.take().unwrap_or_default(), self.tail_saving)
    }

    /// Allocates and immediately frees `bytes` (a transient on top of what is live).
    pub fn transient(&mut self, bytes: u128, category: Category) {
        if self.stopped {
            return;
        }
        let bytes = self.round(bytes);
        self.add_live(bytes, category);
        self.sub_live(bytes, category);
    }

    /// Records a node: takes a reference on each saved tensor (only while recording).
    #[inline]
    pub fn record(&mut self, mut node: Node) {
        if !self.recording {
            if let Some(tail) = self.tail.as_mut() {
                if node.saves_nothing() {
                    tail.push(node);
                } else {
                    tail.clear();
                    self.tail_saving += 1;
                }
            }
            return;
        }
        if let Some(n) = self.stop {
            if !node.saves_nothing() {
                if n <= 1 {
                    self.stop_at(&node);
                } else {
                    self.stop = Some(n - 1);
                }
            }
        }
        if self.host.active && !node.grads_in_saved {
            // save_on_cpu's pack hook: a host copy instead of a reference
            let bytes: u128 = node
                .saved
                .as_slice()
                .iter()
                .map(|&s| self.tensors[s as usize].bytes)
                .sum();
            node.offloaded += bytes;
            node.saved = Ids::default();
            self.host.live += bytes;
            self.host.peak = self.host.peak.max(self.host.live);
        }
        for &s in node.saved.as_slice() {
            self.retain(s);
        }
        for &p in node.params.as_slice() {
            if let Some(ps) = self.tensors[p as usize].param.as_mut() {
                if ps.trainable {
                    ps.uses += 1;
                }
            }
        }
        self.tape.push(node);
    }

    /// A new gradient, or a reference to `given` when the node hands on an existing tensor.
    fn new_grad(&mut self, bytes: u128, given: Option<TensorId>) -> TensorId {
        match given {
            Some(g) => {
                self.retain(g);
                g
            }
            None => self.alloc(bytes, Category::Temporaries, false),
        }
    }

    #[cfg(test)]
    fn grad_for_input(&mut self, x: TensorId, given: Option<TensorId>) {
        if let Some(new) = self.new_input_grad(x, given) {
            self.sum_input_grad(x, new);
        }
    }

    /// A node's new gradient for activation `x`: stored as `x`'s gradient when it is the first
    /// (`None` returned), returned when `x` already has one, to be summed with it by
    /// [`Timeline::sum_input_grad`] once the node's incoming gradients are released.
    fn new_input_grad(&mut self, x: TensorId, given: Option<TensorId>) -> Option<TensorId> {
        let bytes = self.tensors[x as usize].bytes;
        let new = self.new_grad(bytes, given);
        if self.tensors[x as usize].grad.is_some() {
            Some(new)
        } else {
            self.tensors[x as usize].grad = Some(new);
            None
        }
    }

    /// `old + new` out of place into `x`'s input buffer (`InputBuffer::accumulate`), then
    /// both released.
    fn sum_input_grad(&mut self, x: TensorId, new: TensorId) {
        let bytes = self.tensors[x as usize].bytes;
        let sum = self.alloc(bytes, Category::Temporaries, false);
        if let Some(old) = self.tensors[x as usize].grad {
            self.release(old);
        }
        self.release(new);
        self.tensors[x as usize].grad = Some(sum);
    }

    /// A node's gradient for parameter `p`. Autograd sums the gradients a parameter receives in
    /// its AccumulateGrad node's input buffer (out of place, `InputBuffer::accumulate`) and runs
    /// AccumulateGrad once the last one arrived (`torch/csrc/autograd/engine.cpp`): a tied
    /// embedding holds the LM head's gradient through the whole backward. AccumulateGrad then
    /// steals the buffer as `.grad`, or adds it in place when `.grad` exists (accumulation).
    ///
    /// This is the first half: the node's new gradient for `p` (none for a frozen parameter).
    /// [`Timeline::accumulate_param_grad`] hands it to the AccumulateGrad input buffer after
    /// the node's own incoming gradients are released (`Engine::evaluate_function`: the node's
    /// inputs are moved into `call_function` and die with it, before its outputs are added to
    /// the next nodes' input buffers).
    fn grad_for_param(&mut self, p: TensorId, given: Option<TensorId>) -> Option<TensorId> {
        let state = self.tensors[p as usize].param?;
        if !state.trainable {
            return None;
        }
        Some(self.new_grad(state.grad_bytes, given))
    }

    /// The second half of [`Timeline::grad_for_param`]: `new` into `p`'s input buffer (an
    /// out-of-place sum with a pending gradient), then AccumulateGrad once the last use arrived.
    fn accumulate_param_grad(&mut self, p: TensorId, new: TensorId) {
        let Some(state) = self.tensors[p as usize].param else {
            return;
        };
        let pending = match state.pending {
            None => new,
            Some(old) => {
                let sum = self.alloc(state.grad_bytes, Category::Temporaries, false);
                self.release(old);
                self.release(new);
                sum
            }
        };
        let uses = state.uses.saturating_sub(1);
        let (pending, grad) = if uses == 0 {
            match state.grad {
                None => {
                    self.retag(pending, Category::Gradients);
                    (None, Some(pending))
                }
                Some(g) => {
                    self.release(pending);
                    (None, Some(g))
                }
            }
        } else {
            (Some(pending), state.grad)
        };
        if let Some(ps) = self.tensors[p as usize].param.as_mut() {
            ps.uses = uses;
            ps.pending = pending;
            ps.grad = grad;
        }
    }

    /// Runs one node's backward (without recompute handling).
    pub fn backward_node(&mut self, node: &Node) {
        // save_on_cpu's unpack hook: the saved tensors copied back to the device first
        self.add_live(node.offloaded, Category::Temporaries);
        let temps: u128 = node.backward_temps;
        self.add_live(temps, Category::Temporaries);
        let mut given = node.saved.as_slice().iter().copied();
        let mut next_given = || {
            if node.grads_in_saved {
                given.next()
            } else {
                None
            }
        };
        // the gradient of the node's first output, which its input gradient may be (or alias)
        let output_grad = node
            .outputs
            .as_slice()
            .first()
            .and_then(|&o| self.tensors[o as usize].grad);
        let mut from_output = output_grad.filter(|_| node.input_grad_is_output_grad);
        let alias = output_grad.filter(|_| node.input_grads_alias_output);
        // (activation, its second gradient) pairs summed after the incoming gradients are gone
        let (mut summed, mut seconds) = (Ids::default(), Ids::default());
        for &x in node.inputs.as_slice() {
            let g = from_output.take().or_else(&mut next_given).or_else(|| {
                alias.filter(|&g| self.tensors[g as usize].bytes == self.tensors[x as usize].bytes)
            });
            if self.tensors[x as usize].requires_grad {
                if let Some(new) = self.new_input_grad(x, g) {
                    summed.push(x);
                    seconds.push(new);
                }
            }
        }
        let late = node.param_grads_cast;
        if late {
            self.sub_live(node.offloaded, Category::Temporaries);
            if node.offloaded != 0 {
                self.host.live = self.host.live.saturating_sub(node.offloaded);
            }
            for &o in node.outputs.as_slice() {
                if let Some(g) = self.tensors[o as usize].grad.take() {
                    self.release(g);
                }
            }
            for &s in node.saved.as_slice() {
                self.release(s);
            }
        }
        // (parameter, its new gradient) pairs, inline: nodes hold at most six parameters
        let (mut owners, mut news) = (Ids::default(), Ids::default());
        for &p in node.params.as_slice() {
            let g = next_given();
            if let Some(new) = self.grad_for_param(p, g) {
                owners.push(p);
                news.push(new);
            }
        }
        if !late {
            // the unpacked copies die with the node's apply; its host copies with the node
            self.sub_live(node.offloaded, Category::Temporaries);
            if node.offloaded != 0 {
                self.host.live = self.host.live.saturating_sub(node.offloaded);
            }
            for &o in node.outputs.as_slice() {
                if let Some(g) = self.tensors[o as usize].grad.take() {
                    self.release(g);
                }
            }
        }
        // The backward formula's temporaries die inside the node's apply. A gradient an
        // activation already has is summed with the new one in its consumer's input buffer,
        // which `Engine::evaluate_function` (torch/csrc/autograd/engine.cpp, torch 2.15) does
        // once `call_function` has returned: after the node's formula, with every gradient it
        // produces (parameters' included) made and its incoming gradients consumed. A node that
        // runs last among an activation's producers has released its incoming gradient (when
        // it held the last reference) before the sum (measured: rnd-t17-058-gpt2, the LoRA
        // c_proj's frozen base runs after the adapter's path and its [b, s, E] incoming
        // gradient is gone when the GELU output's two [b, s, 4E] gradients are added: +1.674%
        // when summed beside it; tools/truth/probes/rmsnorm_backward.py shows the sum after
        // PowBackward's temporaries are freed).
        self.sub_live(temps, Category::Temporaries);
        for (&x, &new) in summed.as_slice().iter().zip(seconds.as_slice()) {
            self.sum_input_grad(x, new);
        }
        for (&p, &new) in owners.as_slice().iter().zip(news.as_slice()) {
            self.accumulate_param_grad(p, new);
        }
        if !late {
            for &s in node.saved.as_slice() {
                self.release(s);
            }
        }
    }

    /// Moves the pending gradient of `from` onto `to` (a recomputed twin of the same value).
    /// Takes `id`'s gradient (the caller owns its reference).
    pub fn take_grad(&mut self, id: TensorId) -> Option<TensorId> {
        self.tensors[id as usize].grad.take()
    }

    /// Whether `id` holds a gradient now.
    pub fn has_grad(&self, id: TensorId) -> bool {
        self.tensors[id as usize].grad.is_some()
    }

    /// Gives `id` the gradient `g` (a test's incoming gradient held by the caller too).
    #[cfg(test)]
    pub(crate) fn set_grad(&mut self, id: TensorId, g: TensorId) {
        self.retain(g);
        self.tensors[id as usize].grad = Some(g);
    }

    /// Moves `from`'s gradient to `to`.
    pub fn move_grad(&mut self, from: TensorId, to: TensorId) {
        let g = self.tensors[from as usize].grad.take();
        self.tensors[to as usize].grad = g;
    }

    /// Gives a loss tensor its seed gradient (`torch.ones_like(loss)`); returns it.
    pub fn seed_grad(&mut self, loss: TensorId) -> TensorId {
        let b = self.tensors[loss as usize].bytes;
        let g = self.alloc(b, Category::Temporaries, false);
        self.tensors[loss as usize].grad = Some(g);
        g
    }

    /// Gradient tensor of a parameter, if it exists.
    pub fn param_grad(&self, p: TensorId) -> Option<TensorId> {
        self.tensors[p as usize].param.and_then(|s| s.grad)
    }

    /// Drops every parameter's `.grad` (`zero_grad(set_to_none=True)`).
    pub fn zero_grad(&mut self) {
        // the parameters in id order, as a scan of every record would visit them
        for k in 0..self.params.len() {
            let i = self.params[k] as usize;
            if let Some(g) = self.tensors[i].param.as_mut().and_then(|s| s.grad.take()) {
                self.release(g);
            }
        }
    }

    /// Live bytes now.
    pub fn live(&self) -> u128 {
        self.live
    }

    /// Peak live bytes so far.
    pub fn peak(&self) -> u128 {
        debug_assert!(!self.segmenting, "the peak is not kept while segmenting");
        self.peak
    }

    /// Breakdown at the peak, in [`Category::ALL`] order.
    pub fn peak_breakdown(&self) -> [u128; 9] {
        debug_assert!(!self.segmenting, "the peak is not kept while segmenting");
        if self.peak_pending {
            self.by_category
        } else {
            self.peak_by_category
        }
    }

    /// Phase in which the peak occurred.
    pub fn peak_phase(&self) -> Phase {
        debug_assert!(!self.segmenting, "the peak is not kept while segmenting");
        self.peak_phase
    }

    /// Forgets the peak (steady-state measurement starts now).
    pub fn reset_peak(&mut self) {
        self.settle();
        self.host.peak = self.host.live;
        self.phase_peaks = [0; 6];
        self.phase_peaks[self.phase as usize] = self.live;
        self.peak = self.live;
        self.peak_by_category = self.by_category;
        self.peak_pending = false;
        self.peak_phase = self.phase;
        if self.segmenting {
            // the measurement starts here: the live bytes now are its first candidate
            self.segments.clear();
            let tag = self.seg.tag;
            self.segments.push(Segment {
                hit: true,
                max: self.live,
                at: self.by_category,
                ..Segment::open(tag, self.phase)
            });
            self.seg = Segment::open(tag, self.phase);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_tensor_outlives_python_reference() {
        let mut t = Timeline::new();
        let w = t.param(100, true);
        let x = t.alloc(10, Category::Activations, true);
        let y = t.alloc(20, Category::Activations, true);
        t.record(Node {
            saved: Ids::of(&[x]),
            inputs: Ids::of(&[x]),
            params: Ids::of(&[w]),
            outputs: Ids::of(&[y]),
            ..Node::default()
        });
        t.release(x); // python drops x, autograd keeps it
        assert_eq!(t.live(), 130);
        t.seed_grad(y);
        let node = t.tape.pop().unwrap();
        t.backward_node(&node);
        // x freed, y's grad freed, x's grad (10) and w's grad (100) remain, y still referenced
        assert_eq!(t.live(), 100 + 20 + 10 + 100);
        assert_eq!(t.peak(), 100 + 10 + 20 + 20 + 10 + 100);
    }

    #[test]
    fn second_gradient_is_summed_out_of_place() {
        let mut t = Timeline::new();
        let x = t.alloc(8, Category::Activations, true);
        t.grad_for_input(x, None);
        let before = t.live();
        t.grad_for_input(x, None);
        assert_eq!(t.live(), before);
        assert_eq!(t.peak(), before + 16);
    }

    #[test]
    fn second_gradient_is_summed_after_the_incoming_gradient_is_released() {
        // `y = f(x)` where `x` already received a gradient from another consumer: the node's
        // backward temporaries (2 bytes) and its incoming gradient (y's, 4 bytes, held by
        // nothing else) die before `old + new`
        let mut t = Timeline::new();
        let x = t.alloc(16, Category::Activations, true);
        let y = t.alloc(4, Category::Activations, true);
        t.record(Node {
            inputs: Ids::of(&[x]),
            outputs: Ids::of(&[y]),
            backward_temps: 2,
            ..Node::default()
        });
        t.grad_for_input(x, None);
        t.seed_grad(y);
        let before = t.live();
        let node = t.tape.pop().unwrap();
        t.backward_node(&node);
        // temps (2) and new (16) beside y's gradient (4), then the sum (16) without either
        assert_eq!(t.peak(), before + 16 + 16 - 4);
        assert_eq!(t.live(), before - 4);
    }

    #[test]
    fn a_shared_incoming_gradient_stays_for_the_sum() {
        // the same, but y's gradient is also x's first gradient (an add's operands share it):
        // releasing the node's reference frees nothing, the sum is made beside it
        let mut t = Timeline::new();
        let x = t.alloc(16, Category::Activations, true);
        let y = t.alloc(16, Category::Activations, true);
        t.record(Node {
            inputs: Ids::of(&[x]),
            outputs: Ids::of(&[y]),
            ..Node::default()
        });
        t.seed_grad(y);
        let gy = t.tensors[y as usize].grad.unwrap();
        t.retain(gy);
        t.tensors[x as usize].grad = Some(gy);
        let before = t.live();
        let node = t.tape.pop().unwrap();
        t.backward_node(&node);
        assert_eq!(t.peak(), before + 16 + 16);
        assert_eq!(t.live(), before);
    }

    #[test]
    fn add_hands_its_gradient_to_operands_of_the_same_bytes() {
        // `y = a + b` with a 16-bit `b` of half the bytes: `a`'s gradient is `y`'s own tensor,
        // `b` gets a new one (the engine's cast)
        let mut t = Timeline::new();
        let a = t.alloc(16, Category::Activations, true);
        let b = t.alloc(8, Category::Activations, true);
        let y = t.alloc(16, Category::Activations, true);
        t.record(Node {
            inputs: Ids::of(&[a, b]),
            outputs: Ids::of(&[y]),
            input_grads_alias_output: true,
            ..Node::default()
        });
        t.seed_grad(y);
        let gy = t.tensors[y as usize].grad;
        let before = t.live();
        let node = t.tape.pop().unwrap();
        t.backward_node(&node);
        assert_eq!(t.live(), before + 8);
        assert_eq!(t.tensors[a as usize].grad, gy);
        assert_ne!(t.tensors[b as usize].grad, gy);
        assert_eq!(t.peak(), before + 8);
    }

    #[test]
    fn an_unrecorded_pass_keeps_the_nodes_after_its_last_saving_one() {
        let mut t = Timeline::new();
        let x = t.alloc(10, Category::Activations, true);
        let y = t.alloc(10, Category::Activations, true);
        let op = |saved: &[TensorId], i: TensorId, o: TensorId| Node {
            saved: Ids::of(saved),
            inputs: Ids::of(&[i]),
            outputs: Ids::of(&[o]),
            ..Node::default()
        };
        t.recording = false;
        t.start_tail();
        t.record(op(&[], x, y));
        t.record(op(&[x], x, y));
        t.tail_barrier();
        t.record(op(&[], x, y));
        t.record(op(&[], y, x));
        t.recording = true;
        let (tail, saving) = t.take_tail();
        assert_eq!(saving, 2);
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[1].inputs.as_slice(), &[y]);
        // nothing recorded, nothing retained
        assert!(t.tape.is_empty());
        assert_eq!(t.tensors[x as usize].refs, 1);
    }

    #[test]
    fn a_recompute_stops_at_its_last_saved_tensor() {
        let mut t = Timeline::new();
        t.stop_after(2);
        let a = t.alloc(10, Category::Activations, true);
        let b = t.alloc(20, Category::Activations, true);
        t.record(Node {
            saved: Ids::of(&[a]),
            inputs: Ids::of(&[a]),
            outputs: Ids::of(&[b]),
            ..Node::default()
        });
        // the last saving op saves only its input: its output is never made
        let c = t.alloc(40, Category::Activations, true);
        t.record(Node {
            saved: Ids::of(&[b]),
            inputs: Ids::of(&[b]),
            outputs: Ids::of(&[c]),
            ..Node::default()
        });
        assert_eq!((t.live(), t.peak()), (30, 30));
        // and nothing after it
        let d = t.alloc(80, Category::Activations, true);
        t.transient(160, Category::Activations);
        assert_eq!((t.live(), t.peak()), (30, 30));
        assert!(t.end_stop());
        t.release(d);
        t.release(c);
        assert_eq!(t.live(), 30);
        // an op that saves its output made it
        t.stop_after(1);
        let e = t.alloc(5, Category::Activations, true);
        t.record(Node {
            saved: Ids::of(&[e]),
            outputs: Ids::of(&[e]),
            ..Node::default()
        });
        assert_eq!(t.live(), 35);
        assert!(t.end_stop());
    }
}
