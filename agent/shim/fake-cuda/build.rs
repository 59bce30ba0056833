//! The fake driver answers to `libcuda.so.1`, as the real one does: programs linked
//! against it record that name and find it (or the real driver) at run time.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
