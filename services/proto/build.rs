//! Generates the gRPC code from `proto/` with protox, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/allot/v1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    // A launch carries a tenant's registry password and secrets: their `Debug` (lib.rs)
    // leaves them out.
    tonic_prost_build::configure()
        .skip_debug(["allot.v1.Launch", "allot.v1.JobSecret"])
        .compile_fds(fds)?;
    Ok(())
}
