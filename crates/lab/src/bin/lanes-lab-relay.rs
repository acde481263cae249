//! The delay relay as a program of its own (`lanes lab relay` runs the same code), so the lab's
//! tests can start relays without the `lanes` binary.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match lanes_lab::relay::main(&args, std::io::stdout()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanes-lab-relay: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
