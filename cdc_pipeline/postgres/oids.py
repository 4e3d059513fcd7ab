"""The one table of built-in PostgreSQL type OIDs the pipeline treats specially.

pgoutput sends each column's type as a pg_type OID. Three places turn such a type into something:
the decoder (postgres/pgtypes.py: Python values), the drain's JSON writer (capture/json_text.py: JSON
fragments) and delivery's Spark schema (delivery/spark_stage.py). All of them read the OIDs and the
array-to-element map from here. Other OIDs the pipeline decides on by name (NamedOID, OID_ALIASES,
FIRST_USER_OID) live here too. Values are fixed by PostgreSQL (pg_type.dat) for every version.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class OID(IntEnum):
    """pg_type OIDs of the built-in types given dedicated handling."""

    BOOL = 16
    BYTEA = 17
    CHAR = 18
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    TEXT = 25
    OID = 26
    JSON = 114
    FLOAT4 = 700
    FLOAT8 = 701
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    NUMERIC = 1700
    UUID = 2950
    JSONB = 3802
    # Array types ("_int4" etc.).
    JSON_ARRAY = 199
    BOOL_ARRAY = 1000
    BYTEA_ARRAY = 1001
    CHAR_ARRAY = 1002
    NAME_ARRAY = 1003
    INT2_ARRAY = 1005
    INT4_ARRAY = 1007
    TEXT_ARRAY = 1009
    BPCHAR_ARRAY = 1014
    VARCHAR_ARRAY = 1015
    INT8_ARRAY = 1016
    FLOAT4_ARRAY = 1021
    FLOAT8_ARRAY = 1022
    OID_ARRAY = 1028
    TIMESTAMP_ARRAY = 1115
    DATE_ARRAY = 1182
    TIME_ARRAY = 1183
    TIMESTAMPTZ_ARRAY = 1185
    NUMERIC_ARRAY = 1231
    UUID_ARRAY = 2951
    JSONB_ARRAY = 3807


class NamedOID(IntEnum):
    """pg_type OIDs of built-in types whose values the converters leave as text, named for the decisions
    made about them (backfill/typed.py). No members of OID: every array type there is read as an array."""

    REGPROC = 24
    MONEY = 790
    MONEY_ARRAY = 791
    REGPROCEDURE = 2202
    REGOPER = 2203
    REGOPERATOR = 2204
    REGCLASS = 2205
    REGTYPE = 2206
    REGCONFIG = 3734
    REGDICTIONARY = 3769
    REGNAMESPACE = 4089
    REGROLE = 4096
    REGCOLLATION = 4191


# FirstNormalObjectId: types from here on are user-defined.
FIRST_USER_OID: Final = 16384

# Each array type above -> its element type ("_int4" -> int4).
ARRAY_ELEMENT: Final[dict[int, OID]] = {
    o: OID[o.name.removesuffix("_ARRAY")] for o in OID if o.name.endswith("_ARRAY")
}

# Types whose text output is a JSON number as it stands (NaN and infinities aside).
NUMBERS: Final = frozenset({OID.INT2, OID.INT4, OID.INT8, OID.OID, OID.FLOAT4, OID.FLOAT8, OID.NUMERIC})

# The OID alias types (regclass, regtype, ...): their values print as names that only the catalog of the
# database they were read from resolves.
OID_ALIASES: Final = frozenset({
    NamedOID.REGPROC, NamedOID.REGPROCEDURE, NamedOID.REGOPER, NamedOID.REGOPERATOR, NamedOID.REGCLASS,
    NamedOID.REGTYPE, NamedOID.REGCONFIG, NamedOID.REGDICTIONARY, NamedOID.REGNAMESPACE, NamedOID.REGROLE,
    NamedOID.REGCOLLATION})
