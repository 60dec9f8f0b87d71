fn main() -> std::process::ExitCode {
    atou::run_cli()
}
