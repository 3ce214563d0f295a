//! The shared library's name for the dynamic linker: `libvipl.so.1`, ABI 1
//! of the VIPL API of `vipl.h`.
//!
//! The library that `make install` installs is linked from `libvipl.a`
//! with `vipl.map` (the version node `VIPL_1.0`, only the `Vip*` functions
//! exported): rustc gives a cdylib its own anonymous version script, which
//! a named node cannot be combined with.  The cdylib that cargo builds gets
//! the same SONAME, so that a program linked against either records
//! `libvipl.so.1`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvipl.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
