//! memwall-core: a pure model of the memory (and later the bandwidth) of LLM workloads.
//!
//! Data flows `ModelDesc` + `TrainWorkload` → [`memory::simulate_train`] → [`memory::TrainEstimate`].
//! Nothing in this crate does I/O, reads the environment or the clock.

pub mod dtype;
pub mod emit;
pub mod error;
pub mod gpu;
pub mod layout;
pub mod memory;
pub mod model;
pub mod quant;
pub mod roofline;
pub mod serve;
pub mod units;
pub mod workload;

pub use dtype::DType;
pub use error::CoreError;
pub use model::ModelDesc;
pub use units::Bytes;
