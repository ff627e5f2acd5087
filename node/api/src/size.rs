//! How sizes are written for people: the daemon's `ls` and the CLI's tables. The formatters are
//! hwspec's, beside the parser the daemon reads sizes with.

pub use hwspec::{format_size, readable_size};
