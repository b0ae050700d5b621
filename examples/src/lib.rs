//! Runnable examples of ccl (see `src/bin`). Each binary is also run by
//! `tests/run_examples.rs`, so an example that breaks fails the tests.
//! [`plot`] draws the benchmarks' charts.

pub mod plot;
