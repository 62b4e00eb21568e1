//! Compiles `proto/csi.proto` into Rust (prost messages + tonic clients and servers) without a
//! system `protoc`: `protox` parses the file into descriptors, `tonic-prost-build` generates.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds = protox::compile(["proto/csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
