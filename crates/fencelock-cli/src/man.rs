//! `fencelock man`: the manual pages, made from the clap definitions with `clap_mangen`,
//! one per (visible) command: fencelock(1), fencelock-run(1), ...

use std::io::{self, Write};
use std::path::Path;

use clap::CommandFactory;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};

use crate::args::{Cli, ManArgs};
use crate::exit::Failure;

/// Prints the page asked for, or writes every page into `--dir` and prints their paths.
pub(crate) fn print(args: &ManArgs) -> Result<(), Failure> {
    let pages = pages();
    let wanted = match &args.subcommand {
        Some(sub) => format!("fencelock-{sub}"),
        None => "fencelock".to_owned(),
    };
    let Some(dir) = &args.dir else {
        let (name, command) = pages
            .iter()
            .find(|(name, _)| *name == wanted)
            .ok_or_else(|| Failure::Usage(format!("no manual page {wanted}(1)")))?;
        let mut stdout = io::stdout().lock();
        return match render(name, command, &mut stdout).and_then(|()| stdout.flush()) {
            // A reader that stopped early (`| head`) wanted no more.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            other => other.map_err(|e| Failure::System(format!("cannot write the man page: {e}"))),
        };
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        Failure::System(format!(
            "cannot create the directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut stdout = io::stdout().lock();
    for (name, command) in &pages {
        let path = dir.join(format!("{name}.1"));
        write_page(name, command, &path).map_err(|e| {
            Failure::System(format!("cannot write the man page {}: {e}", path.display()))
        })?;
        writeln!(stdout, "{}", path.display())
            .map_err(|e| Failure::System(format!("cannot write to stdout: {e}")))?;
    }
    Ok(())
}

fn write_page(name: &str, command: &clap::Command, path: &Path) -> io::Result<()> {
    let mut page = Vec::new();
    render(name, command, &mut page)?;
    std::fs::write(path, page)
}

/// Every page, as (name, command): fencelock's, then each visible subcommand's,
/// named as its parent's page, a dash and its own name (`fencelock-run`).
fn pages() -> Vec<(String, clap::Command)> {
    fn add(name: String, command: clap::Command, pages: &mut Vec<(String, clap::Command)>) {
        let subs: Vec<clap::Command> = command
            .get_subcommands()
            .filter(|sub| !sub.is_hide_set())
            .cloned()
            .collect();
        pages.push((name.clone(), command));
        for sub in subs {
            add(format!("{name}-{}", sub.get_name()), sub, pages);
        }
    }
    // No `help` subcommand: it would be listed with a page of its own; built, so that
    // each subcommand has its usage (`fencelock run`) and the global options.
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    let mut pages = Vec::new();
    add("fencelock".to_owned(), root, &mut pages);
    pages
}

/// Renders the page `name` of `command`: clap_mangen's sections, but the text after
/// the options (`after_help`, laid out for a terminal) as man sections of its own
/// (see [`after_help`]), and a SEE ALSO on subcommands' pages.
fn render(name: &str, command: &clap::Command, out: &mut dyn Write) -> io::Result<()> {
    let page = Man::new(command.clone())
        .title(name)
        .source(format!("fencelock {}", env!("CARGO_PKG_VERSION")));
    let mut text: Vec<u8> = Vec::new();
    page.render_title(&mut text)?;
    page.render_name_section(&mut text)?;
    let mut synopsis = Vec::new();
    page.render_synopsis_section(&mut synopsis)?;
    text.extend(with_separator(command, &synopsis));
    page.render_description_section(&mut text)?;
    if command.get_arguments().any(|arg| !arg.is_hide_set()) {
        page.render_options_section(&mut text)?;
    }
    if command.get_subcommands().any(|sub| !sub.is_hide_set()) {
        page.render_subcommands_section(&mut text)?;
    }
    let mut roff = Roff::new();
    if name == "fencelock" {
        // The terminal's top-level help only points to `run`'s; the page has it all.
        after_help(&mut roff, crate::args::AFTER_HELP);
    } else if let Some(after) = command
        .get_after_long_help()
        .or_else(|| command.get_after_help())
    {
        after_help(&mut roff, &after.to_string());
    }
    if let Some((parent, _)) = name.rsplit_once('-') {
        roff.control("SH", ["SEE ALSO"]);
        roff.text([bold(parent), roman("(1)")]);
    }
    roff.to_writer(&mut text)?;
    if command.get_version().is_some() {
        page.render_version_section(&mut text)?;
    }
    // Each section rendered on its own starts with the definition of the apostrophe
    // string (`.ie` and `.el` lines; text lines never start with a dot): once is enough.
    let mut definitions = 0;
    for line in text.split_inclusive(|byte| *byte == b'\n') {
        if line.starts_with(b".ie ") || line.starts_with(b".el ") {
            definitions += 1;
            if definitions > 2 {
                continue;
            }
        }
        out.write_all(line)?;
    }
    Ok(())
}

/// The text after the options, laid out for a terminal, as man sections: a block
/// whose first line ends with a colon and whose other lines are indented (`Exit
/// status:` and its table) is a section of that name with an item (`.TP`) per entry,
/// an entry being a line indented least, its first word the tag, and the lines
/// indented more its continuation; the other blocks are paragraphs of NOTES. (As
/// roff text, a table laid out with spaces is refilled and comes out garbled.)
fn after_help(roff: &mut Roff, text: &str) {
    let mut in_notes = false;
    for block in text
        .split("\n\n")
        .map(str::trim_end)
        .filter(|b| !b.is_empty())
    {
        let mut lines = block.lines();
        let first = lines.next().unwrap_or_default();
        let rest: Vec<&str> = lines.collect();
        let table = first.ends_with(':')
            && !rest.is_empty()
            && rest
                .iter()
                .all(|line| line.starts_with(char::is_whitespace));
        if !table {
            if !in_notes {
                roff.control("SH", ["NOTES"]);
                in_notes = true;
            }
            roff.control("PP", []);
            roff.text([roman(join(block.lines()))]);
            continue;
        }
        in_notes = false;
        roff.control("SH", [first.trim_end_matches(':').to_uppercase().as_str()]);
        let indent = |line: &str| line.len() - line.trim_start().len();
        let least = rest.iter().map(|line| indent(line)).min().unwrap_or(0);
        let mut entries: Vec<(&str, Vec<&str>)> = Vec::new();
        for line in rest {
            match entries.last_mut() {
                Some((_, body)) if indent(line) > least => body.push(line),
                _ => {
                    let entry = line.trim();
                    let (tag, body) = entry.split_once(char::is_whitespace).unwrap_or((entry, ""));
                    entries.push((tag, vec![body]));
                }
            }
        }
        // Wide enough for every tag, so that each one's text starts on its line.
        let width = entries.iter().map(|(tag, _)| tag.len()).max().unwrap_or(0) + 2;
        let width = width.to_string();
        for (tag, body) in entries {
            roff.control("TP", [width.as_str()]);
            roff.text([bold(tag)]);
            roff.text([roman(join(body.into_iter()))]);
        }
    }
}

/// Lines of text as one line, each trimmed, separated by a space.
fn join<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    lines
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The synopsis as `--help` writes it: clap_mangen leaves out the `--` that must come
/// before an argument taken only after it (`run`'s COMMAND), and the `...` of one that
/// takes several words.
fn with_separator(command: &clap::Command, synopsis: &[u8]) -> Vec<u8> {
    let mut text = String::from_utf8_lossy(synopsis).into_owned();
    for arg in command.get_positionals().filter(|a| a.is_last_set()) {
        for name in arg.get_value_names().into_iter().flatten() {
            let plain = format!("<\\fI{name}\\fR>");
            let many = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
            let dots = if many { "..." } else { "" };
            text = text.replacen(&plain, &format!("\\fB\\-\\-\\fR {plain}{dots}"), 1);
        }
    }
    text.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_status_table_becomes_one_item_per_code() {
        let mut roff = Roff::new();
        after_help(&mut roff, crate::args::AFTER_HELP);
        let text = roff.to_roff();
        let tags: Vec<&str> = text
            .lines()
            .skip_while(|line| *line != ".SH \"EXIT STATUS\"")
            .take_while(|line| *line != ".SH NOTES")
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|pair| pair[0].starts_with(".TP"))
            .map(|pair| pair[1])
            .collect();
        let codes = [
            "COMMAND's",
            "64",
            "69",
            "70",
            "75",
            "76",
            "126",
            "127",
            "128+N",
        ];
        let expected: Vec<String> = codes.iter().map(|c| format!("\\fB{c}\\fR")).collect();
        assert_eq!(tags, expected, "{text}");
        assert!(text.contains("signal N killed it\n"), "{text}");
        assert_eq!(text.matches(".PP").count(), 4, "{text}");
    }

    #[test]
    fn the_synopsis_of_run_has_the_separator_before_command() {
        let pages = pages();
        let (name, run) = pages
            .iter()
            .find(|(name, _)| *name == "fencelock-run")
            .unwrap();
        let mut text = Vec::new();
        render(name, run, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let synopsis = text
            .lines()
            .skip_while(|line| *line != ".SH SYNOPSIS")
            .nth(1)
            .unwrap();
        assert!(
            synopsis.ends_with("<\\fINAME\\fR> \\fB\\-\\-\\fR <\\fICOMMAND\\fR>... "),
            "{synopsis}"
        );
    }
}
