"""A type matrix for the fidelity tests (issue 20): one wide table per family of PostgreSQL 15 types, each
with an int primary key `id` and rows of edge values (NULLs, NaN, ±Infinity, -0, BC and far-future
dates, numerics of thousands of digits, arrays with other lower bounds, empty ranges, escapes, user
types). Cells are SQL literal text (cast by the column), None (NULL) or `Expr` (raw SQL)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql


@dataclass(frozen=True)
class Expr:
    text: str


Cell = str | Expr | None


@dataclass(frozen=True)
class Table:
    name: str  # in schema public
    columns: tuple[tuple[str, str], ...]  # (name, type), without the key `id`
    rows: tuple[tuple[Cell, ...], ...]  # ids 1, 2, ... in order


USER_TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'with space', 'quo"te,(x)');
CREATE TYPE inner_t AS (i int, r real);
CREATE TYPE outer_t AS (name text, inner_v inner_t, tags text[], m mood);
CREATE DOMAIN dint AS int CHECK (VALUE > 0);
CREATE DOMAIN dnum AS numeric(10,2);
CREATE DOMAIN darr AS int[];
CREATE DOMAIN dcomp AS inner_t;
CREATE DOMAIN dtext AS text CHECK (VALUE <> 'forbidden');
CREATE DOMAIN dmood AS mood;
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TYPE moodrange AS RANGE (subtype = mood);
"""

BIG = Expr("repeat('9', 20000)::numeric")  # 20,000 digits: beyond Python's default int-from-text limit
TINY = Expr("('0.' || repeat('0', 15000) || '17')::numeric")
LONG_FRACTION = Expr("('-' || repeat('1234567890', 300) || '.' || repeat('0987654321', 100))::numeric")

NUMBERS = Table("fid_num", (
    ("b", "bool"), ("i2", "int2"), ("i4", "int4"), ("i8", "int8"), ("n", "numeric"), ("n102", "numeric(10,2)"),
    ("nbig", "numeric"), ("f4", "real"), ("f8", "double precision"), ("m", "money"), ("o", "oid"),
    ("lsn", "pg_lsn")), (
    ("true", "-32768", "-2147483648", "-9223372036854775808", "NaN", "12345678.90", BIG, "NaN", "NaN",
     "-92233720368547758.08", "0", "0/0"),
    ("false", "32767", "2147483647", "9223372036854775807", "Infinity", "-0.01", TINY, "Infinity", "Infinity",
     "92233720368547758.07", "4294967295", "FFFFFFFF/FFFFFFFF"),
    (None,) * 12,
    ("true", "0", "0", "0", "-Infinity", "0", LONG_FRACTION, "-Infinity", "-Infinity", "0", "1234", "16/B374D848"),
    ("false", "-1", "-1", "-1", "-0.000000000000000000001", "1.5", "1e-300", "-0", "-0", "-1.5", "1", "0/1"),
    (None, "1", "1", "1", "123456789012345678901234567890.123456789012345678901234567890", "99999999.99", "0.0",
     "1.5e-10", "1e+100", "1", None, None),
    ("true", "2", "2", "2", "1.50", "-99999999.99", "1e+1000", "3.4028235e+38", "5e-324", "0.01", "7", "1/0"),
    ("false", "3", "3", "3", "0.000", "0.10", "-1e-1000", "1.17549435e-38", "1.7976931348623157e+308", "-0.01",
     "8", "A/B"),
))

TEXTS = Table("fid_text", (
    ("t", "text"), ("vc", "varchar(5)"), ("c", "char(4)"), ("ch", '"char"'), ("nm", "name"), ("by", "bytea"),
    ("u", "uuid"), ("x", "xml"), ("bt", "bit(4)"), ("vb", "varbit"), ("tsv", "tsvector"), ("tsq", "tsquery"),
    ("j", "json"), ("jb", "jsonb")), (
    ('quote " apostrophe \' back \\ slash\nnewline\ttab\r', "abcde", "ab", "a", "with space", "\\x00ff5c0a",
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", '<a b="1">t&amp;&lt;</a>', "1010", "", "a:1A fat:2 cat's",
     "fat & (rat | !cat)", '{"b": 1,  "a": [1, 2.50, "x"], "b": 2}', '{"b": 1, "a": [1, 2.50, "x"]}'),
    ("é日本🙂 \u00a0\u2028", "é日本🙂", "é", "\\", '"q"', "\\x", "00000000-0000-0000-0000-000000000000",
     "text<b/>more", "0000", "101", "", "", "null", "null"),
    (None,) * 14,
    ("", "", "", "", "", "\\x5c", "ffffffff-ffff-ffff-ffff-ffffffffffff", "", "1111", "0", "'a b' 'c''d'",
     "'a b' <-> c:*", '"str \\" \\u00e9 \\n"', '{"k": null, "e": "\\u00e9", "n": 1e2, "f": -0.0}'),
    ("NULL", "(,)", "(,) ", '"', "NULL", "\\xdeadbeef", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12",
     "<?xml version=\"1.0\"?><r/>", "0101", "1" * 70, "x:1,2,3 y", "!x", "[]", "[]"),
    ("{a,b}", "{}", "{", ",", "{x}", "\\x7b7d", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a13", "<r>\u00e9</r>", "0011",
     None, None, None, '1e400', '123456789012345678901234567890.5'),
    ("tab\there \\\\ \\n \"()\",", " x ", "  ", "z", "name_" + "x" * 58, "\\x00", None, "<r/>", None, None, None,
     None, '  {"a" : [ ]}  ', '{"a": {"b": {"c": [null, true, false, -0.00]}}}'),
))

TIMES = Table("fid_time", (
    ("d", "date"), ("ts", "timestamp"), ("tstz", "timestamptz"), ("tm", "time"), ("ttz", "timetz"),
    ("iv", "interval"), ("ts3", "timestamp(3)"), ("tm0", "time(0)")), (
    ("4714-11-24 BC", "4714-11-24 00:00:00 BC", "4714-11-24 00:00:00+00 BC", "00:00:00", "00:00:00+15:59",
     "-178000000 years", "4714-11-24 00:00:00.123 BC", "00:00:00"),
    ("5874897-12-31", "294276-12-31 23:59:59.999999", "294276-12-31 23:59:59.999999+00", "24:00:00",
     "24:00:00-15:59", "178000000 years", "294276-12-31 23:59:59.999", "24:00:00"),
    (None,) * 8,
    ("infinity", "infinity", "infinity", "23:59:59.999999", "12:34:56.789+05:30",
     "1 year 2 mons 3 days 04:05:06.789", "infinity", "23:59:59"),
    ("-infinity", "-infinity", "-infinity", "12:00:00.5", "12:00:00-00:00:01", "-1 mons +2 days -00:00:01.5",
     "-infinity", "12:00:01"),
    ("2000-02-29", "2000-02-29 23:59:59.999999", "2025-06-01 12:00:00.000001+05:30", "01:02:03.000001",
     "01:02:03+00", "0", "2000-02-29 23:59:59.999", "01:02:03"),
    ("0001-01-01 BC", "0001-01-01 00:00:00 BC", "0001-12-31 23:59:59+00 BC", "13:00", "13:00-03",
     "2147483647 mons 2147483647 days 2562047788:00:54.775807", "1999-12-31 23:59:59.999", "13:00:00"),
    ("1970-01-01", "1970-01-01 00:00:00", "1970-01-01 00:00:00+00", "00:00:00.000001", "00:00:00.000001+14",
     "-2147483648 mons -2147483648 days -2562047788 hours -54.775807 seconds", "1970-01-01 00:00:00", "00:00:01"),
))

NETGEO = Table("fid_netgeo", (
    ("ip", "inet"), ("net", "cidr"), ("mac", "macaddr"), ("mac8", "macaddr8"), ("pt", "point"), ("ln", "line"),
    ("ls", "lseg"), ("bx", "box"), ("pa", "path"), ("pg", "polygon"), ("ci", "circle")), (
    ("192.168.0.1/24", "10.0.0.0/8", "08:00:2b:01:02:03", "08:00:2b:01:02:03:04:05", "(1.5,-2)", "{1,-1,0}",
     "[(0,0),(1,1)]", "(1,1),(0,0)", "[(0,0),(1,1),(2,0)]", "((0,0),(1,1),(1,0))", "<(0,0),2.5>"),
    ("::1", "2001:db8::/32", "ff:ff:ff:ff:ff:ff", "00:00:00:ff:fe:00:00:00", "(0.1,1e-300)", "{0,1,-0.5}",
     "[(-1e+100,1e+100),(0.1,0.2)]", "(0,0),(0,0)", "((0,0),(1,1))", "((0,0))", "<(1e-10,-1e10),0>"),
    (None,) * 11,
    ("2001:db8::1/64", "0.0.0.0/0", "00:00:00:00:00:00", "00:00:00:00:00:00:00:00", "(NaN,Infinity)",
     "{1,0,-Infinity}", "[(1,2),(3,4)]", "(Infinity,1),(-Infinity,0)", "[(1.5,2.5)]", "((1,2),(3,4),(5,6),(7,8))",
     "<(1,2),Infinity>"),
    ("::ffff:1.2.3.4", "::/0", "01:23:45:67:89:ab", "01:23:45:ff:fe:67:89:ab", "(-0,-0)", "{-0,1,0}",
     "[(0,0),(0,0)]", "(-0,-0),(-0,-0)", "[(0,0),(-0,1)]", "((1,1),(2,2))", "<(-0,0),1e+300>"),
))

RANGES = Table("fid_range", (
    ("r4", "int4range"), ("r8", "int8range"), ("rn", "numrange"), ("rts", "tsrange"), ("rtz", "tstzrange"),
    ("rd", "daterange"), ("m4", "int4multirange"), ("m8", "int8multirange"), ("mn", "nummultirange"),
    ("mts", "tsmultirange"), ("mtz", "tstzmultirange"), ("md", "datemultirange")), (
    ("empty", "empty", "empty", "empty", "empty", "empty", "{}", "{}", "{}", "{}", "{}", "{}"),
    ("[1,5)", "(,)", "(1.5,2.50]", '["4714-11-24 00:00:00 BC",infinity)', '("2025-01-01 00:00:00+05",)',
     "[-infinity,infinity)", "{[1,3),[5,7)}", "{(,)}", "{[1.0,2.00],(3,)}", '{["2000-01-01",infinity)}',
     '{(,"1970-01-01 00:00:00+00"]}', "{[2000-01-01,2000-01-02)}"),
    (None,) * 12,
    ("(,3]", "[-9223372036854775808,9223372036854775807)", "(-Infinity,Infinity)", "(,)", "[infinity,infinity]",
     "[4714-11-24 BC,5874897-12-31)", "{(,),[1,2)}", "{[1,2),[3,4),[5,6)}", "{(-Infinity,NaN]}", "{empty}",
     "{}", "{[-infinity,infinity]}"),
    ("[0,0]", "[1,1]", "[NaN,NaN]", '["294276-12-31 23:59:59.999999",)', "(,)", "[2000-02-29,2000-03-01]",
     "{[1,1],[3,3]}", None, "{[0.000,0.0]}", None, '{["4714-11-24 00:00:00+00 BC",)}', None),
))

ARRAYS = Table("fid_array", (
    ("ai2", "int2[]"), ("ai4", "int4[]"), ("ai8", "int8[]"), ("an", "numeric[]"), ("af4", "real[]"),
    ("af8", "float8[]"), ("ab", "bool[]"), ("at", "text[]"), ("avc", "varchar(3)[]"), ("ach", "char(2)[]"),
    ("aby", "bytea[]"), ("ad", "date[]"), ("ats", "timestamp[]"), ("atz", "timestamptz[]"), ("atm", "time[]"),
    ("aiv", "interval[]"), ("au", "uuid[]"), ("aj", "json[]"), ("ajb", "jsonb[]"), ("aip", "inet[]"),
    ("apt", "point[]"), ("abx", "box[]"), ("arn", "numrange[]"), ("ar4", "int4range[]"),
    ("amr", "int4multirange[]"), ("abit", "bit(2)[]"), ("aoid", "oid[]"), ("atsv", "tsvector[]"),
    ("amo", "money[]"), ("ax", "xml[]"), ("alsn", "pg_lsn[]"), ("aname", "name[]")), (
    ("{}",) * 32,
    ("[2:4]={5,6,7}", "{1,NULL,3}", "[4:4]={NULL}", "[0:1]={1.1,2.2}", "{NaN,Infinity,-Infinity,-0}",
     "[0:1]={1.1,2.2}", "{t,f,NULL}", '{"a b","c,d",NULL,"NULL","","q\\"uote","back\\\\slash","{}"}',
     '{"a,b","",NULL}', '{"a ","",NULL}', '{"\\\\x00ff",NULL,"\\\\x"}', "{4714-11-24 BC,infinity,NULL}",
     '{"4714-11-24 00:00:00 BC","294276-12-31 23:59:59.999999",-infinity}',
     '{"2025-01-01 00:00:00+05","4714-11-24 00:00:00+00 BC",infinity}', '{24:00:00,00:00:00.000001}',
     '{00:00:00,01:42:20,"-1 mons +2 days -00:00:01.5",NULL}', '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}',
     '{"{\\"a\\": 1}","null",NULL,"[1,  2]"}', '{"{\\"a\\": 1}","null",NULL}', '{192.168.0.1/24,::1,NULL}',
     '{"(1,2)","(NaN,-0)"}', "{(1,1),(0,0);(3,3),(2,2)}", '{"[1.5,2.5)",empty,NULL}', '{"[1,3)",empty}',
     '{"{[1,3),[5,7)}","{}"}', '{01,NULL,10}', '{0,4294967295}', "{\"'a' 'b':1\",\"\"}", '{1.50,-2,NULL}',
     '{"<a/>","t&amp;"}', "{0/0,FFFFFFFF/FFFFFFFF}", '{"a b",NULL,""}'),
    (None,) * 32,
    ("{{1,2},{3,4}}", "[0:1][1:2]={{1,2},{3,4}}", "{{NULL}}", "[-3:-2]={1e+1000,-0.0}", "{{1.5},{2.5}}",
     "{{1e+100,1.5e-10},{5e-324,NULL}}", "[2:2][3:3]={{t}}", '{{"a","b"},{NULL,"\\\\"}}', '{{a},{b}}',
     '{{x,y}}', '{{"\\\\x",NULL}}', "[1:1]={2000-02-29}", '{{"1970-01-01 00:00:00"}}', '[0:0]={-infinity}',
     '{{13:00}}', '[3:3]={"178000000 years"}', '{{00000000-0000-0000-0000-000000000000}}', '[0:0]={"{}"}',
     '[0:0]={"{}"}', '{{::1},{10.0.0.1}}', '[5:5]={"(0,0)"}', '[2:2]={(0,0),(0,0)}', '{{"(,)"},{"[0,0]"}}',
     '[0:0]={"(,)"}', '[0:0]={"{(,)}"}', '{{11}}', '[7:7]={0}', '{{"a:1"}}', '[0:0]={0}', '[2:2]={"<r/>"}',
     '[0:0]={1/1}', '[0:0]={x}'),
))

USER = Table("fid_user", (
    ("e", "mood"), ("ea", "mood[]"), ("c", "inner_t"), ("co", "outer_t"), ("ca", "inner_t[]"), ("di", "dint"),
    ("dn", "dnum"), ("da", "darr"), ("dc", "dcomp"), ("dt", "dtext"), ("dm", "dmood"), ("adi", "dint[]"),
    ("adn", "dnum[]"), ("fr", "floatrange"), ("mr", "moodrange"), ("fmr", "floatmultirange"),
    ("ada", "darr[]")), (
    ("happy", "{sad,happy,NULL}", "(2,2)", '("quoted \\"text\\", (x)","(1,NaN)","{a,\\"b c\\"}",ok)',
     '{"(1,2)","(,)",NULL}', "2", "12345678.90", "{1,3}", "(2,2)", "hello", "sad", "{1,NULL,2}", "{1.50,NULL}",
     "[1.5,Infinity)", "[sad,happy)", "{[1,2),[3,4)}", '{"{1,2}","{3}"}'),
    ("with space", '{"with space","quo\\"te,(x)"}', "(,)", "(,,,)", "{}", "1", "-0.01", "{}", "(,)", "",
     "quo\"te,(x)", "[0:1]={1,1}", "{}", "empty", "empty", "{}", "{}"),
    (None,) * 17,
    ('quo"te,(x)', "[2:3]={ok,sad}", "(-1,-0)", '(,"(,)",{},)', '[0:0]={"(3,Infinity)"}', "2147483647",
     "99999999.99", "[2:3]={5,6}", "(0,1.5)", 'x "q" \\ y', "with space", "{{1},{2}}", "{{1.00}}",
     "(-Infinity,NaN]", "(,)", "{(,)}", '[0:0]={"[2:2]={7}"}'),
))

TABLES = (NUMBERS, TEXTS, TIMES, NETGEO, RANGES, ARRAYS, USER)

# PostgreSQL 14's interval input refuses the extremes 15 takes (its hours field stops at 2^31 - 1): there
# those cells are the largest it reads (and prints: -2147483648 hours prints as "--2147483648:00:00" on 14).
_PG14_CELLS = {
    "2147483647 mons 2147483647 days 2562047788:00:54.775807": "2147483647 mons 2147483647 days 2147483647 hours",
    "-2147483648 mons -2147483648 days -2562047788 hours -54.775807 seconds":
        "-2147483647 mons -2147483647 days -2147483647 hours",
}


def tables_for(major: int) -> tuple[Table, ...]:
    """TABLES as a server of `major` can hold them."""
    if major >= 15:
        return TABLES
    return tuple(Table(t.name, t.columns, tuple(tuple(_PG14_CELLS.get(c, c) if isinstance(c, str) else c
                                                      for c in row) for row in t.rows)) for t in TABLES)


def _cell(value: Cell) -> sql.Composable:
    if value is None:
        return sql.SQL("NULL")
    if isinstance(value, Expr):
        return sql.SQL(value.text)  # type: ignore[arg-type]  # test constants, not input
    return sql.Literal(value)


def create_sql(table: Table) -> sql.Composed:
    return sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {})").format(
        sql.Identifier("public", table.name),
        sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))  # type: ignore[arg-type]
                           for c, t in table.columns))


def insert_sql(table: Table, id_offset: int = 0) -> sql.Composed:
    """All of the table's rows, as ids `id_offset + 1, ...`, each cell cast to its column's type."""
    return sql.SQL("INSERT INTO {} (id, {}) VALUES {}").format(
        sql.Identifier("public", table.name), sql.SQL(", ").join(sql.Identifier(c) for c, _ in table.columns),
        sql.SQL(", ").join(
            sql.SQL("({}, {})").format(sql.Literal(id_offset + i), sql.SQL(", ").join(
                sql.SQL("{}::{}").format(_cell(v), sql.SQL(t))  # type: ignore[arg-type]
                for v, (_, t) in zip(row, table.columns, strict=True)))
            for i, row in enumerate(table.rows, 1)))


def rotate_sql(table: Table, ids: range) -> sql.Composed:
    """Every column of the rows `ids` set to the values of the next row of `ids` (the last takes the
    first's): an update whose new tuple carries every column (no value is an unchanged TOAST pointer)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c, _ in table.columns)
    ident = sql.Identifier("public", table.name)
    return sql.SQL("UPDATE {} t SET ({}) = (SELECT {} FROM {} s WHERE s.id = {} + (t.id - {} + 1) % {}) "
                   "WHERE t.id BETWEEN {} AND {}").format(
        ident, cols, cols, ident, sql.Literal(ids.start), sql.Literal(ids.start), sql.Literal(len(ids)),
        sql.Literal(ids.start), sql.Literal(ids[-1]))
