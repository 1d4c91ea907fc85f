//! memwall-core: a pure model of the memory (and later the bandwidth) of LLM workloads.
//!
//! Data flows `ModelDesc` + `TrainWorkload` → [`memory::simulate_train`] → [`memory::TrainEstimate`];
//! the same inputs plus a [`layout::Layout`] and a GPU → [`time::estimate_step_time`] →
//! [`time::StepTime`].
//! Nothing in this crate does I/O, reads the environment or the clock.

pub mod dtype;
pub mod error;
pub mod gpu;
pub mod layout;
pub mod memory;
pub mod model;
pub mod quant;
pub mod roofline;
pub mod serve;
pub mod time;
pub mod units;
pub mod workload;

pub use dtype::DType;
pub use error::CoreError;
pub use model::ModelDesc;
pub use units::Bytes;
