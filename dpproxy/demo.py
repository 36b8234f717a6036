"""The bundled demo database: synthetic census-like people and their visits.

Everything is generated from one seed with numpy, so the same seed always gives
the same table contents. Nothing here comes from real people: ``adult`` mimics
the marginal distributions of the UCI Adult census extract (32,561 rows), with
plausible correlations between age, education, occupation, hours and income.

Tables:

* ``adult``: one row per person (privacy unit ``person_id``).
* ``visits``: 1 to 50 rows per person, skewed, so contribution bounding matters.
* ``occupation_groups``: a public lookup table, occupation -> collar.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np

__all__ = [
    "ADULT_ROWS",
    "DEFAULT_SEED",
    "EDUCATION_COUNTS",
    "MAX_VISITS_PER_PERSON",
    "OCCUPATION_COUNTS",
    "OCCUPATION_GROUPS",
    "build_demo",
    "ensure_demo",
    "load_demo_postgres",
]

DEFAULT_SEED = 20261123
ADULT_ROWS = 32_561
MAX_VISITS_PER_PERSON = 50

# Exact multiplicities; the remaining ADULT_ROWS - sum(...) = 1,843 people have NULL occupation.
OCCUPATION_COUNTS: dict[str, int] = {
    "Adm-clerical": 3770,
    "Exec-managerial": 4066,
    "Handlers-cleaners": 1370,
    "Prof-specialty": 4140,
    "Other-service": 3295,
    "Sales": 3650,
    "Craft-repair": 4099,
    "Transport-moving": 1597,
    "Farming-fishing": 994,
    "Machine-op-inspct": 2002,
    "Tech-support": 928,
    "Protective-serv": 649,
    "Armed-Forces": 9,
    "Priv-house-serv": 149,
}

# Adult's education levels in education_num order (1..16) with Adult's exact counts.
EDUCATION_COUNTS: dict[str, int] = {
    "Preschool": 51,
    "1st-4th": 168,
    "5th-6th": 333,
    "7th-8th": 646,
    "9th": 514,
    "10th": 933,
    "11th": 1175,
    "12th": 433,
    "HS-grad": 10501,
    "Some-college": 7291,
    "Assoc-voc": 1382,
    "Assoc-acdm": 1067,
    "Bachelors": 5355,
    "Masters": 1723,
    "Prof-school": 576,
    "Doctorate": 413,
}

OCCUPATION_GROUPS: dict[str, str] = {
    "Adm-clerical": "white",
    "Exec-managerial": "white",
    "Handlers-cleaners": "blue",
    "Prof-specialty": "white",
    "Other-service": "service",
    "Sales": "white",
    "Craft-repair": "blue",
    "Transport-moving": "blue",
    "Farming-fishing": "blue",
    "Machine-op-inspct": "blue",
    "Tech-support": "white",
    "Protective-serv": "service",
    "Armed-Forces": "military",
    "Priv-house-serv": "service",
}

HIGH_INCOME_ROWS = 7_841  # Adult's count of '>50K'
SEXES = ("Male", "Female")
INCOMES = ("<=50K", ">50K")

# Per occupation (and a final entry for NULL): P(male), education shift, income shift.
_OCCUPATION_TRAITS: tuple[tuple[float, float, float], ...] = (
    (0.33, 0.1, -0.3),  # Adm-clerical
    (0.71, 0.8, 0.9),  # Exec-managerial
    (0.88, -0.7, -1.0),  # Handlers-cleaners
    (0.63, 1.3, 0.7),  # Prof-specialty
    (0.45, -0.6, -1.5),  # Other-service
    (0.69, 0.1, 0.2),  # Sales
    (0.95, -0.4, 0.0),  # Craft-repair
    (0.94, -0.5, 0.0),  # Transport-moving
    (0.93, -0.7, -0.8),  # Farming-fishing
    (0.71, -0.6, -0.4),  # Machine-op-inspct
    (0.62, 0.4, 0.3),  # Tech-support
    (0.88, 0.0, 0.3),  # Protective-serv
    (1.00, 0.0, 0.0),  # Armed-Forces
    (0.05, -1.0, -2.5),  # Priv-house-serv
    (0.54, -0.2, -1.0),  # NULL
)

# Adult's age histogram, roughly: many young adults, a long tail, a top-coded spike at 90.
_AGES = np.arange(17, 91)
_AGE_WEIGHTS = np.interp(
    _AGES,
    [17, 20, 23, 30, 36, 40, 45, 50, 55, 60, 65, 70, 75, 80, 89],
    [395, 753, 877, 861, 898, 794, 734, 602, 419, 312, 178, 89, 45, 22, 5],
)
_AGE_WEIGHTS[-1] = 43
_AGE_P = _AGE_WEIGHTS / _AGE_WEIGHTS.sum()

# Adult's common weekly hours and roughly their shares (40 a little higher, as part-timers
# are drawn separately); the rest comes from a normal.
_COMMON_HOURS = np.array([40, 50, 45, 60, 35, 20, 30, 55, 25, 48, 99])
_COMMON_HOURS_P = np.array(
    [0.50, 0.087, 0.056, 0.045, 0.04, 0.037, 0.035, 0.021, 0.02, 0.016, 0.003]
)

Progress = Callable[[str], None]
Columns = dict[str, np.ndarray]


def build_demo(
    path: str | os.PathLike[str],
    *,
    seed: int = DEFAULT_SEED,
    progress: Progress | None = None,
) -> Path:
    """Write the demo DuckDB file at path and return the path.

    An existing file is replaced atomically: the database is built in a temporary folder
    beside it, then moved over it with os.replace. Missing parent folders are created.
    """
    target = Path(path)
    say: Progress = progress or (lambda _message: None)
    say(f"generating demo data (seed {seed})")
    rng = np.random.default_rng(seed)
    adult = _adult(rng)
    say(f"adult: {ADULT_ROWS:,} people")
    visits = _visits(rng, adult)
    say(f"visits: {len(visits['visit_id']):,} rows")

    target.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".build", dir=target.parent))
    try:
        tmp = workdir / target.name
        _write(tmp, adult, visits)
        say(f"occupation_groups: {len(OCCUPATION_GROUPS)} rows")
        # A write-ahead log left by an unclean shutdown belongs to the old file; DuckDB would
        # replay it onto the new one.
        Path(f"{target}.wal").unlink(missing_ok=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    say(f"wrote {target}")
    return target


def ensure_demo(
    path: str | os.PathLike[str],
    *,
    seed: int = DEFAULT_SEED,
    progress: Progress | None = None,
) -> Path:
    """Build the demo database at path only if no file exists there yet. Returns the path."""
    target = Path(path)
    if target.exists():
        return target
    return build_demo(target, seed=seed, progress=progress)


def _adult(rng: np.random.Generator) -> Columns:
    """Generate the adult table's columns (string columns as codes into their label lists)."""
    n = ADULT_ROWS
    # Occupation: a seeded permutation of a list with exact multiplicities; the last code is NULL.
    multiplicities = [*OCCUPATION_COUNTS.values(), n - sum(OCCUPATION_COUNTS.values())]
    codes = np.repeat(np.arange(len(multiplicities)), multiplicities)
    occupation = rng.permutation(codes)
    traits = np.array(_OCCUPATION_TRAITS)[occupation]
    p_male, edu_shift, income_shift = traits[:, 0], traits[:, 1], traits[:, 2]

    male = rng.random(n) < p_male
    age = rng.choice(_AGES, size=n, p=_AGE_P).astype(np.int32)
    education_num = _education(rng, age, edu_shift + rng.normal(0.0, 1.0, n))
    hours = _hours(rng, age, male)

    # Income: exactly Adult's number of '>50K', the people with the highest latent score.
    score = (
        0.32 * (education_num - 10)
        + 0.035 * (hours - 40)
        + 0.9 * male
        - 0.0025 * (age - 47.0) ** 2
        - 2.0 * (age < 21)
        + income_shift
        + rng.logistic(0.0, 1.0, n)
    )
    high = np.zeros(n, dtype=bool)
    high[np.argsort(-score, kind="stable")[:HIGH_INCOME_ROWS]] = True

    # Capital gain: mostly zero, more often and larger for high earners; 99999 is Adult's cap.
    has_gain = rng.random(n) < np.where(high, 0.21, 0.04)
    amount = np.exp(np.where(high, rng.normal(9.0, 0.7, n), rng.normal(8.0, 0.6, n)))
    amount = np.where(high & (rng.random(n) < 0.07), 99999, amount)
    capital_gain = np.where(has_gain, np.clip(np.rint(amount), 114, 99999), 0).astype(np.int32)

    return {
        "person_id": np.arange(1, n + 1, dtype=np.int32),
        "age": age,
        "sex": np.where(male, 0, 1).astype(np.int32),
        "education_num": education_num,
        "hours_per_week": hours,
        "capital_gain": capital_gain,
        "income": high.astype(np.int32),
        "occupation": occupation.astype(np.int32),
    }


def _education(rng: np.random.Generator, age: np.ndarray, latent: np.ndarray) -> np.ndarray:
    """Assign education_num 1..16 with Adult's exact counts, by rank of a latent score.

    Levels are filled from the top, each with the highest-scoring people still free whose
    age allows it (no 17-year-old with a degree); ties are broken by a seeded shuffle.
    """
    n = len(age)
    cap = np.select(
        [age <= 17, age == 18, age == 19, age == 20, age <= 22, age == 23, age <= 25],
        [7, 9, 10, 11, 13, 14, 15],
        16,
    )
    order = np.lexsort((rng.permutation(n), -latent))  # best first
    level = np.zeros(n, dtype=np.int32)
    counts = list(EDUCATION_COUNTS.values())
    for num in range(len(counts), 0, -1):
        free = order[(level[order] == 0) & (cap[order] >= num)]
        level[free[: counts[num - 1]]] = num
    return level


def _hours(rng: np.random.Generator, age: np.ndarray, male: np.ndarray) -> np.ndarray:
    """Hours per week 1..99: a spike at 40, Adult's other round numbers, and part-timers."""
    n = len(age)
    common = rng.choice(_COMMON_HOURS, size=n, p=_COMMON_HOURS_P / _COMMON_HOURS_P.sum())
    other = np.rint(rng.normal(38.0, 16.0, n))
    hours = np.where(rng.random(n) < _COMMON_HOURS_P.sum(), common, other)
    part_time = np.rint(rng.normal(22.0, 8.0, n))
    p_part = np.where((age < 22) | (age > 65), 0.4, 0.0) + np.where(male, 0.0, 0.06)
    hours = np.where(rng.random(n) < p_part, part_time, hours)
    return np.clip(hours, 1, 99).astype(np.int32)


def _visits(rng: np.random.Generator, adult: Columns) -> Columns:
    """Generate visits: 1..50 per person (heavy-tailed, mean about 8), during 2024."""
    age = adult["age"]
    mu = 1.62 + 0.006 * (age - 38.6)
    counts = np.clip(1 + np.floor(np.exp(rng.normal(mu, 0.9))), 1, MAX_VISITS_PER_PERSON)
    person = np.repeat(adult["person_id"], counts.astype(np.int64))
    m = len(person)

    # 2024 is a leap year starting on a Monday; fewer visits at weekends.
    weekday = np.arange(366) % 7
    weight = np.select([weekday == 5, weekday == 6], [0.7, 0.4], 1.0)
    day = rng.choice(366, size=m, p=weight / weight.sum()).astype(np.int32)
    rich = np.repeat(adult["income"], counts.astype(np.int64))
    amount = np.round(np.clip(rng.lognormal(3.4 + 0.25 * rich, 0.9), 0.0, 500.0), 2)

    # Number visits in chronological order (ties by person), as a real system would.
    order = np.lexsort((person, day))
    return {
        "visit_id": np.arange(1, m + 1, dtype=np.int64),
        "person_id": person[order],
        "day": day[order],
        "amount": amount[order],
    }


_SCHEMA = """
CREATE TABLE adult (
    person_id INTEGER PRIMARY KEY,
    age INTEGER NOT NULL,
    sex VARCHAR NOT NULL,
    education VARCHAR NOT NULL,
    education_num INTEGER NOT NULL,
    hours_per_week INTEGER NOT NULL,
    capital_gain INTEGER NOT NULL,
    income VARCHAR NOT NULL,
    occupation VARCHAR
);
CREATE TABLE visits (
    visit_id BIGINT PRIMARY KEY,
    person_id INTEGER NOT NULL,
    day DATE NOT NULL,
    amount DOUBLE NOT NULL
);
CREATE TABLE occupation_groups (
    occupation VARCHAR PRIMARY KEY,
    collar VARCHAR NOT NULL
);
COMMENT ON TABLE adult IS 'Synthetic census-like people (dpproxy demo), one row per person';
COMMENT ON TABLE visits IS 'Synthetic visits (dpproxy demo), 1 to 50 per person';
COMMENT ON TABLE occupation_groups IS 'Public lookup: occupation to collar (dpproxy demo)';
"""


def _write(path: Path, adult: Columns, visits: Columns) -> None:
    """Create the three tables in a new DuckDB file at path and load the columns."""
    con = duckdb.connect(str(path))
    try:
        con.execute(_SCHEMA)
        con.register("adult_src", adult)
        con.execute(
            """
            INSERT INTO adult
            SELECT person_id, age, ($sexes::VARCHAR[])[sex + 1],
                   ($education::VARCHAR[])[education_num], education_num, hours_per_week,
                   capital_gain, ($incomes::VARCHAR[])[income + 1],
                   ($occupations::VARCHAR[])[occupation + 1]
            FROM adult_src ORDER BY person_id
            """,
            {
                "sexes": list(SEXES),
                "education": list(EDUCATION_COUNTS),
                "incomes": list(INCOMES),
                "occupations": [*OCCUPATION_COUNTS, None],
            },
        )
        con.register("visits_src", visits)
        con.execute(
            """
            INSERT INTO visits
            SELECT visit_id, person_id, DATE '2024-01-01' + day, amount
            FROM visits_src ORDER BY visit_id
            """
        )
        groups = list(OCCUPATION_GROUPS.items())
        con.executemany("INSERT INTO occupation_groups VALUES (?, ?)", groups)
        con.unregister("adult_src")
        con.unregister("visits_src")
        con.execute("CHECKPOINT")
    finally:
        con.close()


_POSTGRES_SCHEMA = """
DROP TABLE IF EXISTS adult, visits, occupation_groups;
CREATE TABLE adult (
    person_id INTEGER PRIMARY KEY,
    age INTEGER NOT NULL,
    sex TEXT NOT NULL,
    education TEXT NOT NULL,
    education_num INTEGER NOT NULL,
    hours_per_week INTEGER NOT NULL,
    capital_gain INTEGER NOT NULL,
    income TEXT NOT NULL,
    occupation TEXT
);
CREATE TABLE visits (
    visit_id BIGINT PRIMARY KEY,
    person_id INTEGER NOT NULL,
    day DATE NOT NULL,
    amount DOUBLE PRECISION NOT NULL
);
CREATE TABLE occupation_groups (
    occupation TEXT PRIMARY KEY,
    collar TEXT NOT NULL
);
COMMENT ON TABLE adult IS 'Synthetic census-like people (dpproxy demo), one row per person';
COMMENT ON TABLE visits IS 'Synthetic visits (dpproxy demo), 1 to 50 per person';
COMMENT ON TABLE occupation_groups IS 'Public lookup: occupation to collar (dpproxy demo)';
"""


def load_demo_postgres(dsn: str, *, seed: int = DEFAULT_SEED,
                       progress: Progress | None = None) -> None:
    """Create the demo tables in the PostgreSQL database (and schema: the first of its
    search_path) that `dsn` names, replacing any demo tables there, with the same rows
    `build_demo` writes for the same seed. One transaction; rows arrive by COPY."""
    import psycopg

    say: Progress = progress or (lambda _message: None)
    say(f"generating demo data (seed {seed})")
    rng = np.random.default_rng(seed)
    adult = _adult(rng)
    visits = _visits(rng, adult)
    educations = list(EDUCATION_COUNTS)
    occupations = [*OCCUPATION_COUNTS, None]
    adult_rows = (
        (int(pid), int(age), SEXES[sex], educations[num - 1], int(num), int(hours), int(gain),
         INCOMES[income], occupations[occupation])
        for pid, age, sex, num, hours, gain, income, occupation in zip(
            adult["person_id"], adult["age"], adult["sex"], adult["education_num"],
            adult["hours_per_week"], adult["capital_gain"], adult["income"],
            adult["occupation"], strict=True))
    first_day = np.datetime64("2024-01-01")
    days = (first_day + visits["day"].astype("timedelta64[D]")).astype(str)
    # repr of a float reads back as the same double: the amounts equal DuckDB's exactly
    visit_lines = "".join(
        f"{vid}\t{pid}\t{day}\t{float(amount)!r}\n"
        for vid, pid, day, amount in zip(visits["visit_id"].tolist(),
                                         visits["person_id"].tolist(), days.tolist(),
                                         visits["amount"].tolist(), strict=True))
    try:
        connection = psycopg.connect(dsn)
    except psycopg.OperationalError:
        from .errors import BackendError

        raise BackendError(f"could not connect to PostgreSQL at {_server_of(dsn)}",
                           hint="check the DSN and the password (PGPASSWORD or ~/.pgpass)"
                           ) from None
    with connection as con:
        con.execute(_POSTGRES_SCHEMA)
        with con.cursor().copy(
                "COPY adult (person_id, age, sex, education, education_num, hours_per_week, "
                "capital_gain, income, occupation) FROM STDIN") as copy:
            for row in adult_rows:
                copy.write_row(row)
        say(f"adult: {ADULT_ROWS:,} people")
        with con.cursor().copy("COPY visits (visit_id, person_id, day, amount) "
                               "FROM STDIN") as copy:
            copy.write(visit_lines)
        say(f"visits: {len(visits['visit_id']):,} rows")
        with con.cursor().copy("COPY occupation_groups (occupation, collar) FROM STDIN") \
                as copy:
            for row in OCCUPATION_GROUPS.items():
                copy.write_row(row)
        say(f"occupation_groups: {len(OCCUPATION_GROUPS)} rows")
        con.execute("ANALYZE adult, visits, occupation_groups")
    say(f"loaded into PostgreSQL at {_server_of(dsn)}")


def _server_of(dsn: str) -> str:
    from .backends.postgres import describe_server

    return describe_server(dsn)
