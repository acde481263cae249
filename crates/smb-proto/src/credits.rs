//! Credits.
