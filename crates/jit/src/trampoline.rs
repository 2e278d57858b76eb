//! Trampolines (see lib docs).
