//! Command lines: a value that looks like a negative number is read as the
//! value of the flag or argument before it, so that `--slots -3` is refused
//! by that flag's own check, naming it, rather than taken for an unknown
//! flag `-3`.

/// Parses the process's arguments into `T`, negative numbers allowed as
/// values everywhere (every subcommand included); exits as clap does on a
/// bad command line or `--help`.
pub fn parse<T: clap::Parser>() -> T {
    let mut command = with_negative_numbers(T::command());
    let matches = command.get_matches_mut();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command).exit())
}

/// `command` with negative numbers allowed as the values of every
/// argument that takes one, in it and in every subcommand.
pub fn with_negative_numbers(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            if arg.get_action().takes_values() {
                arg.allow_negative_numbers(true)
            } else {
                arg
            }
        })
        .mut_subcommands(with_negative_numbers)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

    use super::with_negative_numbers;

    #[derive(Debug, Parser)]
    struct Cli {
        #[arg(long, global = true, default_value_t = 1.0)]
        timeout_s: f64,
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Debug, Subcommand)]
    enum Sub {
        Set {
            #[arg(long)]
            slots: Option<u32>,
            ms: f64,
        },
    }

    fn parse(args: &[&str]) -> Result<Cli, String> {
        let mut command = with_negative_numbers(Cli::command());
        command
            .try_get_matches_from_mut(args)
            .and_then(|m| Cli::from_arg_matches(&m))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn negative_values_reach_their_flag() {
        let cli = parse(&["x", "--timeout-s", "-2", "set", "-5"]).unwrap();
        assert_eq!(cli.timeout_s, -2.0);
        let Sub::Set { ms, .. } = cli.command;
        assert_eq!(ms, -5.0);
        let err = parse(&["x", "set", "--slots", "-3", "1"]).unwrap_err();
        assert!(err.contains("--slots"), "{err}");
        assert!(!err.contains("unexpected argument"), "{err}");
    }
}
