//! boxd-local: placeholder until the provider lands.
fn main() {
    eprintln!("error: boxd-local is not built yet");
    std::process::exit(1);
}
