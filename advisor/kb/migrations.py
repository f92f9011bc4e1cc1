"""The KB's schema: append-only migrations, one function each, with its SQL and any Python step together
(simonw/llm's migrations.py), applied in order by `migrate`.

Append-only: never edit a migration that has shipped; add a new one. A KB records the migrations it has
in `_sqlite_migrations`, the table sqlite-utils kept for the KBs written before this module (its layout
and names kept, so every KB reads the same). Written here rather than through sqlite-utils: a write
that has nothing to migrate then imports nothing beyond the standard library.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from advisor.kb import summaries

MIGRATION_SET = "advisor"
MIGRATIONS_TABLE = "_sqlite_migrations"
# `untrained`: the run ended without its held-out loss going below where it started (the fair protocol)
STATUSES = ("ok", "oom", "diverged", "untrained", "failed", "running", "crashed")
LEGACY_STATUSES = ("ok", "oom", "diverged", "failed", "running", "crashed")  # the CHECK of 0001-0007
# How a run was measured: measure's protocols (advisor/measuring/training/protocol.py), or a Hugging Face Trainer run of the
# user's (AdvisorCallback: their data, rate and schedule); runs that do not say: paper
PROTOCOLS = ("fair", "paper", "trainer")
PROTOCOLS_0008 = ("fair", "paper")  # the CHECK of 0008-0009

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: dict[str, Migration] = {}  # name as recorded ('0001_runs_metrics_epochs') -> its function


def migration(fn: Migration) -> Migration:
    """Register a migration under its function's name without the leading 'm'."""
    MIGRATIONS[fn.__name__.removeprefix("m")] = fn
    return fn


def statements(sql: str) -> list[str]:
    """Split a migration script into statements (executescript would commit the migration's transaction)."""
    out, pending = [], ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def execute(conn: sqlite3.Connection, sql: str) -> None:
    for statement in statements(sql):
        conn.execute(statement)


def applied(conn: sqlite3.Connection) -> list[str]:
    """The names of the migrations a KB has, in order ([] for a file that is not an advisor KB)."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [MIGRATIONS_TABLE]
    ).fetchone()
    if not has_table:
        return []
    rows = conn.execute(
        f"SELECT name FROM {MIGRATIONS_TABLE} WHERE migration_set = ? ORDER BY rowid", [MIGRATION_SET]
    )
    return [r[0] for r in rows]


def migrate(conn: sqlite3.Connection, until: str | None = None) -> list[str]:
    """Apply the pending migrations in order (up to and including `until`), recording each; the caller holds
    the write lock, so that two processes opening a new KB at once do not both create its tables. Returns
    the names applied."""
    _bookkeeping(conn)
    done, ran = set(applied(conn)), []
    for name, fn in MIGRATIONS.items():
        if name not in done:
            fn(conn)
            conn.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (migration_set, name, applied_at) VALUES (?, ?, ?)",
                [MIGRATION_SET, name, str(datetime.now(UTC))],
            )
            ran.append(name)
        if name == until:
            break
    return ran


def pending(conn: sqlite3.Connection) -> bool:
    return not set(MIGRATIONS) <= set(applied(conn))


def _bookkeeping(conn: sqlite3.Connection) -> None:
    """The table of applied migrations, exactly as sqlite-utils created it."""
    conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{MIGRATIONS_TABLE}" (\n   "id" INTEGER PRIMARY KEY,\n'
        '   "migration_set" TEXT,\n   "name" TEXT,\n   "applied_at" TEXT\n)'
    )
    conn.execute(
        'CREATE UNIQUE INDEX IF NOT EXISTS "idx__sqlite_migrations_migration_set_name"\n'
        f'    ON "{MIGRATIONS_TABLE}" ("migration_set", "name")'
    )


def _backfill_uids(conn: sqlite3.Connection) -> None:
    """Runs written before identities existed get theirs, computed from their provenance."""
    from advisor.kb.identity import run_uid  # hashlib (OpenSSL, 3 ms): a migration's, never an answer's

    cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    seen = set()
    for row in conn.execute("SELECT * FROM runs WHERE uid IS NULL").fetchall():
        run = dict(zip(cols, row, strict=True))
        uid = run_uid(run)
        if uid in seen:  # an exact repeat stored twice before identities existed: keep it distinct
            uid = run_uid({**run, "owner": f"legacy:{run['id']}"})
        seen.add(uid)
        conn.execute("UPDATE runs SET uid = ? WHERE id = ?", [uid, run["id"]])


# --- the migrations, in order ---------------------------------------------------------------------------


@migration
def m0001_runs_metrics_epochs(conn: sqlite3.Connection) -> None:
    """Runs with their provenance, run-level figures, per-epoch measurements."""
    execute(
        conn,
        f"""
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            cell_key TEXT NOT NULL,            -- hash of the run's full configuration, seed excluded
            source TEXT NOT NULL,              -- 'paper:2608.08961', 'measured', 'import:<name>'
            model TEXT NOT NULL,               -- 'vit', 'modernbert', ..., a Hugging Face id or a path
            family TEXT NOT NULL,              -- 'vision', 'encoder', 'decoder', 'vlm' (rules/families.toml)
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            preset TEXT NOT NULL,              -- 'tiny', 'small', 'paper', 'custom'
            seed INTEGER,                      -- NULL where the source does not say
            hardware TEXT NOT NULL,            -- 'NVIDIA A100 40GB', 'CPU: AMD EPYC (2 cores)'
            device TEXT,                       -- 'cuda', 'cpu'
            host_memory_gb REAL,               -- RAM of the machine, GB
            accelerator_memory_gb REAL,        -- memory of the accelerator, GB; NULL on CPU
            software TEXT NOT NULL DEFAULT '{{}}', -- JSON: versions of python, torch, transformers, ...
            config TEXT NOT NULL DEFAULT '{{}}',   -- JSON: hyperparameters and everything the cell_key hashes
            pretrained INTEGER,                -- 1 pretrained weights, 0 random init, NULL unknown
            n_params INTEGER,
            status TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in LEGACY_STATUSES)})),
            error TEXT,                        -- why a run is not ok, as the user should read it
            started_at TEXT,                   -- ISO 8601 UTC
            finished_at TEXT
        );
        CREATE INDEX runs_group ON runs (family, source, hardware, preset, model, optimizer, strategy, status);
        CREATE INDEX runs_cell ON runs (cell_key, seed);
        CREATE TABLE metrics (                 -- run-level figures: one row per stated or summarised measure
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            name TEXT NOT NULL,                -- 'loss', 'epoch_time', 'host_ram', ... (rules/metrics.toml)
            value REAL NOT NULL,
            unit TEXT NOT NULL,
            certainty TEXT NOT NULL DEFAULT 'measured', -- 'measured', 'stated', 'inferred'
            note TEXT,                         -- where the figure comes from (e.g. the paper's section)
            PRIMARY KEY (run_id, name)
        ) WITHOUT ROWID;                       -- one b-tree lookup per figure: answers aggregate 100,000s
        CREATE TABLE epochs (                  -- per-epoch measurements of measured runs; NULL = not measurable
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            epoch INTEGER NOT NULL,
            steps INTEGER NOT NULL,
            loss REAL,                         -- mean unscaled per-token (per-sample) loss of the epoch's steps
            wall_s REAL,                       -- seconds, warm-up excluded
            warmup_s REAL,                     -- seconds spent in warm-up steps (first epoch only)
            peak_rss_gb REAL,                  -- peak host RSS of the process and its children, GB
            peak_gpu_allocated_gb REAL,
            peak_gpu_reserved_gb REAL,
            gpu_util REAL,                     -- mean %, NVML
            cpu_util REAL,                     -- mean % of one core, psutil
            energy_j REAL,                     -- NVML energy counter difference
            PRIMARY KEY (run_id, epoch)
        );
        """,
    )


@migration
def m0002_run_owner(conn: sqlite3.Connection) -> None:
    """Who runs a run: 'host:pid', to find the runs of a process that died."""
    execute(
        conn,
        """
        ALTER TABLE runs ADD COLUMN owner TEXT;  -- 'host:pid' of the process running it, to find crashed runs
        """,
    )


@migration
def m0003_validations(conn: sqlite3.Connection) -> None:
    """`advisor validate`'s checks, per machine."""
    execute(
        conn,
        """
        CREATE TABLE validations (             -- `advisor validate`: equivalence checks on a machine
            id INTEGER PRIMARY KEY,
            hardware TEXT NOT NULL,
            device TEXT,
            model TEXT,                        -- NULL for checks without a model (cgd, monitor)
            preset TEXT,
            name TEXT NOT NULL,                -- 'checkpointing_dropout_off', 'accumulation_gradient', ...
            passed INTEGER NOT NULL,           -- 1 passed, 0 failed
            value REAL,                        -- what was measured (e.g. max relative gradient error)
            tolerance REAL,                    -- the bound it must stay within
            detail TEXT NOT NULL,
            software TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL
        );
        CREATE INDEX validations_hardware ON validations (hardware, created_at);
        """,
    )


@migration
def m0004_run_protocol(conn: sqlite3.Connection) -> None:
    """The settings a run changed from its preset's defaults (named `protocol` until 0008)."""
    execute(
        conn,
        """
        -- the settings a measured run changed from its preset's defaults ('lr=0.01, epochs=8'), or
        -- 'preset defaults'; NULL where the source does not say. Answers flag groups that mix protocols.
        ALTER TABLE runs ADD COLUMN protocol TEXT;
        """,
    )


@migration
def m0005_epoch_device_memory(conn: sqlite3.Connection) -> None:
    """NVML's device memory per epoch."""
    execute(
        conn,
        """
        -- NVML's memory used on the device (every process, the CUDA context included), peak of the epoch, GB
        ALTER TABLE epochs ADD COLUMN gpu_device_mem_gb REAL;
        """,
    )


@migration
def m0006_predictions(conn: sqlite3.Connection) -> None:
    """`advisor fit`'s traced steps, cached apart from the runs."""
    execute(
        conn,
        """
        CREATE TABLE predictions (             -- `advisor fit`: traced training steps, never mixed with runs
            key TEXT PRIMARY KEY,              -- hash of all the prediction depends on (advisor/fit.py)
            model TEXT NOT NULL,               -- as asked: a reference name, a folder, a Hugging Face id
            config_hash TEXT NOT NULL,         -- sha256 of the model's config
            model_type TEXT,
            family TEXT,                       -- NULL: no family of rules/families.toml lists the model_type
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            dtype TEXT NOT NULL,               -- fp32, bf16-mixed, fp16-mixed, bf16
            seq_len INTEGER,                   -- text tokens per sample; NULL for images alone
            image_size INTEGER,
            device TEXT NOT NULL,              -- cuda, cpu: which optimizer implementations were traced
            software TEXT NOT NULL,            -- JSON: torch, transformers, the engine's version
            payload TEXT NOT NULL,             -- JSON: per phase, the lines of its peak in the batch; FLOPs
            created_at TEXT NOT NULL
        );
        CREATE INDEX predictions_model ON predictions (config_hash, dtype, seq_len, image_size);
        """,
    )


@migration
def m0007_run_identity_and_lease(conn: sqlite3.Connection) -> None:
    """A run's identity across KBs (existing runs get theirs) and its owner's lease."""
    execute(
        conn,
        """
        -- a run's identity across KBs (imports, merges): a hash of its provenance, given once and carried
        ALTER TABLE runs ADD COLUMN uid TEXT;
        -- until when a running run's owner holds it (ISO 8601 UTC); its heartbeat renews it. Past it, the
        -- run is crashed, whichever host ran it
        ALTER TABLE runs ADD COLUMN lease_until TEXT;
        """,
    )
    _backfill_uids(conn)
    execute(
        conn,
        """
        CREATE UNIQUE INDEX runs_uid ON runs (uid);
        """,
    )


@migration
def m0008_protocols_and_summaries(conn: sqlite3.Connection) -> None:
    """Status `untrained`, the run's protocol and group, and the summaries answers read."""
    execute(
        conn,
        f"""
        -- runs rebuilt (SQLite cannot change a CHECK in place): status `untrained`; `protocol`, the column
        -- that held a run's changed settings, renamed `settings`; `protocol` now names how it was measured
        -- ('fair', 'paper'); `grp`, the evidence group it belongs to. Every existing run was measured as
        -- the paper measured (fixed epochs, training loss): protocol 'paper'.
        CREATE TABLE runs_new (
            id INTEGER PRIMARY KEY,
            cell_key TEXT NOT NULL,
            source TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            preset TEXT NOT NULL,
            seed INTEGER,
            hardware TEXT NOT NULL,
            device TEXT,
            host_memory_gb REAL,
            accelerator_memory_gb REAL,
            software TEXT NOT NULL DEFAULT '{{}}',
            config TEXT NOT NULL DEFAULT '{{}}',
            pretrained INTEGER,
            n_params INTEGER,
            status TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in STATUSES)})),
            error TEXT,
            started_at TEXT,
            finished_at TEXT,
            owner TEXT,
            settings TEXT,                     -- what the run changed from its protocol's defaults ('lr=0.01')
            uid TEXT,
            lease_until TEXT,
            protocol TEXT NOT NULL DEFAULT 'paper' CHECK (protocol IN ({", ".join(repr(p) for p in PROTOCOLS_0008)})),
            grp INTEGER REFERENCES groups (id)  -- set by advisor/store.py on every write, never by a file
        );
        INSERT INTO runs_new (id, cell_key, source, model, family, optimizer, strategy, preset, seed, hardware,
            device, host_memory_gb, accelerator_memory_gb, software, config, pretrained, n_params, status, error,
            started_at, finished_at, owner, settings, uid, lease_until, protocol)
        SELECT id, cell_key, source, model, family, optimizer, strategy, preset, seed, hardware, device,
            host_memory_gb, accelerator_memory_gb, software, config, pretrained, n_params, status, error,
            started_at, finished_at, owner, protocol, uid, lease_until, 'paper' FROM runs;
        DROP TABLE runs;
        ALTER TABLE runs_new RENAME TO runs;
        CREATE UNIQUE INDEX runs_uid ON runs (uid);
        CREATE INDEX runs_cell ON runs (cell_key, seed);
        CREATE INDEX runs_family ON runs (family, source);
        CREATE INDEX runs_grp_seed ON runs (grp, optimizer, strategy, seed, status);
        -- the runs that did not end ok, few among many: which seeds of a configuration failed, and why
        CREATE INDEX runs_not_ok ON runs (grp, optimizer, strategy) WHERE status != 'ok';

        -- Summaries, maintained inside every write transaction (advisor/store.py): answers read these, never
        -- aggregate every figure per question. A KB of 1,000,000 runs answers in well under a second.
        CREATE TABLE groups (                  -- evidence groups: runs that may be ranked against each other
            id INTEGER PRIMARY KEY,
            source TEXT NOT NULL,
            hardware TEXT NOT NULL,
            preset TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL,
            protocol TEXT NOT NULL,
            n_params INTEGER,                  -- the largest a run of the group states
            UNIQUE (source, hardware, preset, model, family, protocol)
        );
        CREATE TABLE cell_status (             -- runs of a configuration by settings and status
            grp INTEGER NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            settings TEXT NOT NULL,            -- '' where the run does not say
            status TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (grp, optimizer, strategy, settings, status)
        ) WITHOUT ROWID;
        CREATE TABLE cell_stats (              -- each measure over the ok runs of a configuration
            grp INTEGER NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            measure TEXT NOT NULL,
            scale TEXT NOT NULL,               -- '' or the runs column the value is multiplied by
            n INTEGER NOT NULL,
            total REAL NOT NULL,
            total_sq REAL NOT NULL,
            first_value REAL NOT NULL,         -- a stored figure and its unit, as its source states it
            first_unit TEXT NOT NULL,
            PRIMARY KEY (grp, optimizer, strategy, measure, scale)
        ) WITHOUT ROWID;
        CREATE TABLE seed_stats (              -- each measure of a configuration's ok runs of one seed
            grp INTEGER NOT NULL,
            measure TEXT NOT NULL,
            seed INTEGER NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            n INTEGER NOT NULL,
            total REAL NOT NULL,
            PRIMARY KEY (grp, measure, seed, optimizer, strategy)
        ) WITHOUT ROWID;
        CREATE TABLE pair_stats (              -- paired by seed: d = mean of a's seed - mean of b's, a < b
            grp INTEGER NOT NULL,
            measure TEXT NOT NULL,
            a_optimizer TEXT NOT NULL,
            a_strategy TEXT NOT NULL,
            b_optimizer TEXT NOT NULL,
            b_strategy TEXT NOT NULL,
            n INTEGER NOT NULL,                -- seeds both configurations have
            sum_d REAL NOT NULL,
            sum_dd REAL NOT NULL,
            PRIMARY KEY (grp, measure, a_optimizer, a_strategy, b_optimizer, b_strategy)
        ) WITHOUT ROWID;
        -- per epoch, what the fair protocol and honest measures add (advisor/measuring/summary.py). From 0008 on,
        -- cpu_util is the % of the cores the run used (capped at 100), from the process's CPU time
        ALTER TABLE epochs ADD COLUMN eval_loss REAL;        -- held-out loss after the epoch
        ALTER TABLE epochs ADD COLUMN eval_accuracy REAL;    -- held-out accuracy (top-1 of the targets)
        ALTER TABLE epochs ADD COLUMN micro_batches INTEGER;
        ALTER TABLE epochs ADD COLUMN samples INTEGER;
        ALTER TABLE epochs ADD COLUMN tokens INTEGER;        -- input tokens, padding excluded (text models)
        ALTER TABLE epochs ADD COLUMN model_flops REAL;      -- counted model FLOPs of the epoch's steps
        ALTER TABLE epochs ADD COLUMN step_time_cv REAL;     -- spread of its step times (std / mean)
        ALTER TABLE epochs ADD COLUMN others_cpu REAL;       -- cores other processes used meanwhile
        """,
    )
    summaries.rebuild(conn)


@migration
def m0009_run_data(conn: sqlite3.Connection) -> None:
    """The data a run trained on, part of its evidence group."""
    execute(
        conn,
        """
        -- the data a run trained on (`advisor measure --data`): 'generated', a Hugging Face dataset at a
        -- commit ('pranavmr/MM-IMDb@ad5b994'), a local file or folder by name and content hash
        -- ('corpus.jsonl sha256:1a2b3c4d5e6f'). NULL where a file does not say: the summaries then fill it
        -- from the source (the paper trained on MM-IMDb at the commit it cites) or from what the run's
        -- config recorded, else '' (not stated). Runs on different data are never ranked together.
        ALTER TABLE runs ADD COLUMN data TEXT;
        -- evidence groups are keyed by their data too: the table rebuilt (SQLite cannot change a UNIQUE in
        -- place), then every group assigned again
        DROP TABLE groups;
        CREATE TABLE groups (
            id INTEGER PRIMARY KEY,
            source TEXT NOT NULL,
            hardware TEXT NOT NULL,
            preset TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL,
            protocol TEXT NOT NULL,
            data TEXT NOT NULL DEFAULT '',
            n_params INTEGER,                  -- the largest a run of the group states
            UNIQUE (source, hardware, preset, model, family, protocol, data)
        );
        """,
    )
    summaries.rebuild(conn)


@migration
def m0010_trainer_protocol(conn: sqlite3.Connection) -> None:
    """Protocol `trainer`: a Trainer run is stored as what it is, never as the paper's protocol."""
    # runs rebuilt (SQLite cannot change a CHECK in place) from its own CREATE statement with the wider CHECK;
    # its indexes are recreated from theirs, and the existing Trainer runs (source 'trainer') are relabelled.
    create = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()[
        0
    ]
    indexes = [
        r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'")
    ]
    old = f"CHECK (protocol IN ({', '.join(repr(p) for p in PROTOCOLS_0008)}))"
    new = f"CHECK (protocol IN ({', '.join(repr(p) for p in PROTOCOLS)}))"
    if old not in create:
        raise sqlite3.DatabaseError("runs has no protocol CHECK of 0008 to widen: not an advisor KB")
    cols = ", ".join(r[1] for r in conn.execute("PRAGMA table_info(runs)"))
    renamed = re.sub(
        r'^CREATE TABLE\s+"?runs"?', "CREATE TABLE runs_new", create, count=1
    )  # RENAME quotes it
    conn.execute(renamed.replace(old, new))
    conn.execute(f"INSERT INTO runs_new ({cols}) SELECT {cols} FROM runs")
    conn.execute("DROP TABLE runs")
    conn.execute("ALTER TABLE runs_new RENAME TO runs")
    for sql in indexes:
        if sql:  # an automatic index (a UNIQUE column) has none, and comes back with the table
            conn.execute(sql)
    conn.execute("UPDATE runs SET protocol = 'trainer' WHERE source = 'trainer'")
    _name_trainer_models(conn)
    summaries.rebuild(conn)


def _name_trainer_models(conn: sqlite3.Connection) -> None:
    """Trainer runs stored under their bare model_type ('llama', a reference model's name) get the identity
    AdvisorCallback now gives a model built from a config: its type and a hash of that config."""
    rows = conn.execute("SELECT id, model, config FROM runs WHERE source = 'trainer'").fetchall()
    for run_id, model, config in rows:
        built = json.loads(config or "{}").get("model_config")
        if isinstance(built, dict) and not built.get("_name_or_path") and model == built.get("model_type"):
            import hashlib  # 3 ms (OpenSSL): a migration's alone, never an answer's

            digest = hashlib.sha256(json.dumps(built, sort_keys=True, default=str).encode()).hexdigest()
            conn.execute("UPDATE runs SET model = ? WHERE id = ?", [f"{model} config {digest[:8]}", run_id])


@migration
def m0011_group_config_hash(conn: sqlite3.Connection) -> None:
    """A group's model by its config too: the sha256 of the config.json its runs record
    (`config.model_config_hash`), so that a user's model matches its runs by content, not by the path typed."""
    execute(
        conn,
        """
        -- the config hash a run of the group records (advisor measure of a user's model, config
        -- model_config_hash); NULL for a reference model, the paper's runs and a source that does not say.
        -- Not part of the group's key: the model's name is, as before. Set by advisor/kb/summaries.py
        ALTER TABLE groups ADD COLUMN config_hash TEXT;
        """,
    )
    summaries.rebuild(conn)
