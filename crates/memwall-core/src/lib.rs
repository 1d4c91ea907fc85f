//! memwall-core: a pure model of the memory (and later the bandwidth) of LLM workloads.
//!
//! Data flows `ModelDesc` + `TrainWorkload` (+ `Layout`) → [`engine::Engine::resolve`] and its
//! capability check → [`memory::simulate_train`] / [`memory::simulate_train_dist`] →
//! [`memory::TrainEstimate`] / [`memory::DistEstimate`]; the same inputs plus a GPU →
//! [`time::estimate_step_time`] → [`time::StepTime`]; both → [`plan::search`] and
//! [`plan::doctor`]; the replay's
//! estimates at a cost independent of the layer, decode-step and GPU counts come from
//! [`memory::fast`].
//! Nothing in this crate does I/O, reads the environment or the clock.

pub mod advice;
pub mod dtype;
pub mod emit;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod layout;
pub mod liger;
pub mod memory;
pub mod mixer;
pub mod model;
pub mod names;
pub mod optimizer;
pub mod plan;
pub mod quant;
pub mod roofline;
pub mod serve;
pub mod serve_ssm;
pub mod speed;
pub mod time;
pub mod units;
pub mod workload;

pub use dtype::{DType, Precision};
pub use engine::Engine;
pub use error::CoreError;
pub use model::ModelDesc;
pub use names::Named;
pub use optimizer::Optimizer;
pub use units::Bytes;
