//! Embedded catalogue.
