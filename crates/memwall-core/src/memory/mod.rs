//! Memory simulation: a step replayed as an allocation timeline.
