//! Unit tests driving logical units through the public request API.
