//! `memwall`: will this LLM training run fit, and what is alive at the peak.

fn main() -> std::process::ExitCode {
    memwall_cli::main()
}
