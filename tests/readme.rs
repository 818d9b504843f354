//! The README's flag reference is the binary's `--help`, so it cannot drift.

use std::process::Command;

#[test]
fn readme_command_line_section_matches_help() {
    let output = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).expect("utf-8 help");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("<!-- help:start -->\n```\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```\n<!-- help:end -->").next())
        .expect("README has the help section markers");
    assert_eq!(
        section.trim_end(),
        help.trim_end(),
        "README's command line section is stale: paste the output of `csi-provisioner --help`"
    );
}
