use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let args = loadgen::Args::parse();
    match loadgen::execute(&args) {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("loadgen: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
