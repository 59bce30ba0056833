//! Batch scripts, as `sbatch` takes them: `#ALLOT` directives (any `allot job submit` flag)
//! and the common `#SBATCH` ones read from the script's comment header and turned into
//! `allot job submit` flags, which the flags on the command line then override; the script
//! itself runs on the node with its own interpreter (its `#!` line, else `sh`), written to
//! a file of the job's own temporary directory first.

use std::path::Path;

use anyhow::{Context, bail};

/// The most a script may be: it travels in the job's command, with its wrapper.
pub const MAX_SCRIPT_BYTES: usize = 60 * 1024;

/// What runs the script: writes it (the first argument) to a new file of its own (`mktemp`:
/// an unpredictable name, created 0600, so nothing there beforehand is followed) in the
/// job's temporary directory and runs that with the rest of the arguments (a script
/// without `#!` runs as an `sh` script), exiting with its status. The file is removed when
/// the script ends, or when the job is stopped (a SIGTERM or SIGINT reaches the script's
/// process group, and the wrapper then exits as a signalled shell does). The script is
/// told its job's id and name under Slurm's names too (`SLURM_JOB_ID`, `SLURM_JOB_NAME`).
const WRAPPER: &str = r#"f=$(mktemp "${TMPDIR:-/tmp}/allot-batch-XXXXXXXX") && trap 'rm -f "$f"' EXIT && trap 'exit 143' TERM && trap 'exit 130' INT && printf '%s' "$1" > "$f" && chmod 700 "$f" && shift && export SLURM_JOB_ID="$ALLOT_JOB_ID" SLURM_JOB_NAME="$ALLOT_JOB_NAME" && "$f" "$@""#;

/// A script read for submitting: its text and its file name.
pub struct Script {
    pub name: String,
    pub text: String,
}

impl Script {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading the script {}", path.display()))?;
        if bytes.len() > MAX_SCRIPT_BYTES {
            bail!(
                "{}: {} bytes; a batch script may be at most {MAX_SCRIPT_BYTES} (put the rest in a volume)",
                path.display(),
                bytes.len()
            );
        }
        let text = String::from_utf8(bytes)
            .with_context(|| format!("{}: a batch script must be text (UTF-8)", path.display()))?;
        if text.trim().is_empty() {
            bail!("{}: the script is empty", path.display());
        }
        if text.contains("\r\n") {
            bail!(
                "{}: the script has DOS line breaks (\\r\\n), which its interpreter would read as part of each line: convert it (dos2unix)",
                path.display()
            );
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "batch".to_owned());
        Ok(Self { name, text })
    }

    /// The job's command: the wrapper, the script, then `args`.
    pub fn command(&self, args: &[String]) -> Vec<String> {
        let mut c = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            WRAPPER.to_owned(),
            self.name.clone(),
            self.text.clone(),
        ];
        c.extend(args.iter().cloned());
        c
    }
}

/// The `allot job submit` flags the script's header directives give, in order; unknown
/// `#SBATCH` directives are an error naming their line, or (with `ignore_unknown`) skipped
/// with a word on standard error.
pub fn directives(
    text: &str,
    ignore_unknown: bool,
    allowed: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<String>> {
    let mut flags = Vec::new();
    let mut said_output = false;
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || (n == 0 && trimmed.starts_with("#!")) {
            continue;
        }
        // The header ends at the first command, as sbatch's does.
        if !trimmed.starts_with('#') {
            break;
        }
        if let Some(rest) = trimmed.strip_prefix("#ALLOT") {
            let words = words(rest).with_context(|| format!("line {line_no}: {trimmed}"))?;
            // Only `job submit`'s own flags: a script never says where the request goes or
            // whose token it carries (a shared script would send the submitter's token
            // elsewhere, or submit as someone else).
            for w in words.iter().filter(|w| w.starts_with('-')) {
                let name = w.split('=').next().unwrap_or(w);
                if name == "--" || !allowed(name) {
                    // The line is not repeated: its value may be a token.
                    bail!(
                        "line {line_no}: `{name}` is not an `allot job submit` flag a script may set"
                    );
                }
            }
            flags.extend(words);
            continue;
        }
        let Some(rest) = trimmed.strip_prefix("#SBATCH") else {
            continue;
        };
        let words = words(rest).with_context(|| format!("line {line_no}: {trimmed}"))?;
        let mut i = 0;
        while i < words.len() {
            let w = &words[i];
            // `--opt=value`, `--opt value`, `-c 4` or `-c4`.
            let (opt, inline) = match w.split_once('=') {
                Some((o, v)) if o.starts_with("--") => (o.to_owned(), Some(v.to_owned())),
                _ if w.len() > 2 && w.starts_with('-') && !w.starts_with("--") => {
                    (w[..2].to_owned(), Some(w[2..].to_owned()))
                }
                _ => (w.clone(), None),
            };
            let known = matches!(
                opt.as_str(),
                "--gres"
                    | "--gpus"
                    | "-G"
                    | "--gpus-per-node"
                    | "--gpus-per-task"
                    | "-c"
                    | "--cpus-per-task"
                    | "--mem"
                    | "-t"
                    | "--time"
                    | "-J"
                    | "--job-name"
                    | "-a"
                    | "--array"
                    | "-d"
                    | "--dependency"
                    | "-N"
                    | "--nodes"
                    | "--exclusive"
                    | "-o"
                    | "--output"
                    | "-e"
                    | "--error"
            );
            // An unknown option takes the next word as its value unless that is an option.
            let takes_value = !matches!(opt.as_str(), "--exclusive" | "--requeue")
                && (known || words.get(i + 1).is_some_and(|w| !w.starts_with('-')));
            let value =
                if !takes_value {
                    None
                } else if inline.is_some() {
                    inline
                } else {
                    i += 1;
                    Some(words.get(i).cloned().with_context(|| {
                        format!("line {line_no}: `{opt}` needs a value: {trimmed}")
                    })?)
                };
            i += 1;
            let v = value.unwrap_or_default();
            let at = |why: String| anyhow::anyhow!("line {line_no}: {why}: {trimmed}");
            match opt.as_str() {
                "--gres" => {
                    let (model, count) = gpus_of_gres(&v).map_err(at)?;
                    flags.extend(["--gpus".into(), count]);
                    if let Some(m) = model {
                        flags.extend(["--gpu-model".into(), m]);
                    }
                }
                "--gpus" | "-G" | "--gpus-per-node" | "--gpus-per-task" => {
                    let (model, count) = match v.split_once(':') {
                        Some((m, c)) => (Some(m.to_owned()), c.to_owned()),
                        None => (None, v.clone()),
                    };
                    flags.extend(["--gpus".into(), count]);
                    if let Some(m) = model {
                        flags.extend(["--gpu-model".into(), m]);
                    }
                }
                "-c" | "--cpus-per-task" => {
                    super::flags::parse_cpus(&v).map_err(|e| at(format!("`{opt} {v}`: {e}")))?;
                    flags.extend(["--cpus".into(), v]);
                }
                "--mem" => flags.extend(["--memory".into(), slurm_memory(&v).map_err(at)?]),
                "-t" | "--time" => {
                    // Slurm's 0, UNLIMITED and INFINITE: no limit (none is set).
                    if !matches!(
                        v.trim(),
                        "0" | "UNLIMITED" | "INFINITE" | "unlimited" | "infinite"
                    ) {
                        let secs = slurm_time(&v).map_err(at)?;
                        flags.extend(["--time-limit".into(), format!("{secs}s")]);
                    }
                }
                "-J" | "--job-name" => flags.extend(["--name".into(), v]),
                "-a" | "--array" => flags.extend(["--array".into(), v]),
                "-d" | "--dependency" => flags.extend(["--dependency".into(), v]),
                "-N" | "--nodes" => {
                    // A range (min-max) asks for at least its first.
                    let n = v.split('-').next().unwrap_or(&v).to_owned();
                    flags.extend(["--replicas".into(), n]);
                }
                "--exclusive" => flags.extend(["--isolation".into(), "dedicated".into()]),
                "-o" | "--output" | "-e" | "--error" => {
                    if !said_output {
                        eprintln!(
                            "line {line_no}: {opt} not applied: Allot keeps each job's output itself (`allot job logs`)"
                        );
                        said_output = true;
                    }
                }
                _ if ignore_unknown => {
                    eprintln!("line {line_no}: `{opt}` skipped (--ignore-unknown-directives)");
                }
                _ => bail!(
                    "line {line_no}: `{opt}` is not a directive Allot reads ({trimmed}); \
                     --ignore-unknown-directives skips such lines"
                ),
            }
        }
    }
    Ok(flags)
}

/// A directive's words, with simple quoting (`"…"`, `'…'`) as a shell reads it.
fn words(s: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            // A comment after the directive.
            (None, '#') if cur.is_empty() && !any => break,
            (None, c) => cur.push(c),
        }
    }
    if quote.is_some() {
        bail!("an unclosed quote");
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

/// `gpu:2`, `gpu:a100:2` or `gpu` (one): the model, if named, and the count.
fn gpus_of_gres(v: &str) -> Result<(Option<String>, String), String> {
    let parts: Vec<&str> = v.split(':').collect();
    match parts.as_slice() {
        ["gpu"] => Ok((None, "1".into())),
        ["gpu", n] if n.parse::<u32>().is_ok() => Ok((None, (*n).to_owned())),
        ["gpu", model, n] if n.parse::<u32>().is_ok() => {
            Ok((Some((*model).to_owned()), (*n).to_owned()))
        }
        _ => Err(format!("`--gres={v}`: Allot reads gpu:N and gpu:MODEL:N")),
    }
}

/// Slurm's `--mem`: a number of megabytes, or with a K, M, G or T suffix.
fn slurm_memory(v: &str) -> Result<String, String> {
    let v = v.trim();
    let (digits, unit) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&v[..i], &v[i..]),
        None => (v, ""),
    };
    let whole = || {
        format!("`--mem={v}`: a whole number of megabytes, or of K, M, G or T (as 1536M for 1.5G)")
    };
    if v.contains('.') {
        return Err(whole());
    }
    let n: u64 = digits.parse().map_err(|_| whole())?;
    if n == 0 {
        return Err(format!(
            "`--mem={v}`: Slurm's \"all of a node's memory\" has no Allot equivalent: ask for an amount"
        ));
    }
    let unit = match unit.to_ascii_uppercase().as_str() {
        "" | "M" | "MB" => "MiB",
        "K" | "KB" => "KiB",
        "G" | "GB" => "GiB",
        "T" | "TB" => "TiB",
        _ => return Err(format!("`--mem={v}`: the unit is K, M, G or T")),
    };
    Ok(format!("{n}{unit}"))
}

/// Slurm's time formats, in seconds: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`.
fn slurm_time(v: &str) -> Result<u64, String> {
    let bad = || format!("`{v}`: a time as Slurm writes it (minutes, MM:SS, HH:MM:SS, D-HH:MM:SS)");
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    let (days, rest) = match v.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, v),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_, _>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86_400 + h * 3600,
        (Some(d), [h, m]) => d * 86_400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86_400 + h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    if secs == 0 {
        return Err(bad());
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbatch_headers_become_submit_flags() {
        let script = "#!/bin/bash\n\
            #SBATCH --job-name=sweep\n\
            #SBATCH --gres=gpu:a100:2 -c 8\n\
            #SBATCH --mem=16G\n\
            #SBATCH -t 1-02:00:00\n\
            #SBATCH --array=0-9%2\n\
            #SBATCH -o out-%j.txt\n\
            #ALLOT --priority high\n\
            # a comment\n\
            \n\
            echo hi\n\
            #SBATCH --mem=1G\n";
        let flags = directives(script, false, &|_| true).expect("read");
        assert_eq!(
            flags,
            [
                "--name",
                "sweep",
                "--gpus",
                "2",
                "--gpu-model",
                "a100",
                "--cpus",
                "8",
                "--memory",
                "16GiB",
                "--time-limit",
                "93600s",
                "--array",
                "0-9%2",
                "--priority",
                "high"
            ],
            "a directive after the first command is not read"
        );
    }

    #[test]
    fn a_script_sets_no_connection_or_identity_flag() {
        let submit_only = |f: &str| matches!(f, "--priority" | "--name");
        for line in [
            "#ALLOT --server http://evil",
            "#ALLOT --token=allot_secret",
            "#ALLOT --ca-cert /x",
            "#ALLOT -- rm",
        ] {
            let err =
                directives(&format!("#!/bin/sh\n{line}\n"), true, &submit_only).expect_err(line);
            assert!(err.to_string().contains("line 2"), "{err}");
            assert!(
                !err.to_string().contains("allot_secret"),
                "not echoed: {err}"
            );
        }
        assert_eq!(
            directives("#ALLOT --priority high --name x\n", false, &submit_only).expect("ok"),
            ["--priority", "high", "--name", "x"]
        );
        // Ignoring unknown sbatch options, one without a value is skipped alone.
        assert_eq!(
            directives("#SBATCH --foo --mem=1G\n", true, &submit_only).expect("ok"),
            ["--memory", "1GiB"]
        );
    }

    #[test]
    fn unknown_directives_name_their_line_unless_ignored() {
        let script = "#!/bin/sh\n#SBATCH --partition=gpu\necho\n";
        let err = directives(script, false, &|_| true).expect_err("unknown");
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(err.to_string().contains("--partition"), "{err}");
        assert_eq!(
            directives(script, true, &|_| true).expect("skipped"),
            Vec::<String>::new()
        );
        assert!(
            directives("#SBATCH --mem\n", false, &|_| true).is_err(),
            "a value is missing"
        );
        assert!(directives("#SBATCH --gres=fpga:1\n", false, &|_| true).is_err());
    }

    #[test]
    fn slurm_times_and_sizes_read_as_slurm_means_them() {
        assert_eq!(slurm_time("90"), Ok(5400), "bare minutes");
        assert_eq!(slurm_time("10:30"), Ok(630));
        assert_eq!(slurm_time("01:00:00"), Ok(3600));
        assert_eq!(slurm_time("2-0"), Ok(172_800));
        assert!(slurm_time("0").is_err() && slurm_time("x").is_err());
        assert_eq!(slurm_memory("4000").as_deref(), Ok("4000MiB"));
        assert_eq!(slurm_memory("2G").as_deref(), Ok("2GiB"));
        assert!(slurm_memory("2X").is_err());
        assert!(slurm_memory("0").is_err(), "all of a node's memory");
        for unlimited in ["0", "UNLIMITED", "infinite"] {
            let flags = directives(&format!("#SBATCH -t {unlimited}\n"), false, &|_| true)
                .expect(unlimited);
            assert!(flags.is_empty(), "{unlimited}: no limit, {flags:?}");
        }
        assert!(
            slurm_memory("1.5G").is_err_and(|e| e.contains("1536M")),
            "a fraction says how to write it"
        );
    }
}
