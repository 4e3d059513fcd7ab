"""The one OID table (postgres/oids.py) against the real catalog, and the three places that read it: the
decoder, the drain's JSON writer and delivery's Spark schema agree on which types are arrays."""

from __future__ import annotations

from pyspark.sql import types as T

from cdc_pipeline.capture.json_text import fragment_for
from cdc_pipeline.delivery.spark_stage import spark_type
from cdc_pipeline.postgres.oids import ARRAY_ELEMENT, FIRST_USER_OID, NUMBERS, OID, OID_ALIASES, NamedOID
from cdc_pipeline.postgres.pgtypes import converter
from cdc_pipeline_tests.conftest import Database


def test_every_oid_names_its_postgres_type_and_every_array_its_element(source_db: Database) -> None:
    rows = source_db.execute("SELECT oid::int, typname, typelem::int FROM pg_type WHERE oid = ANY(%s)",
                             ([int(o) for o in OID],))
    catalog = {oid: (name, elem) for oid, name, elem in rows}
    for o in OID:
        name, elem = catalog[o]
        if o in ARRAY_ELEMENT:
            assert name == "_" + catalog[ARRAY_ELEMENT[o]][0] and elem == ARRAY_ELEMENT[o], o
        else:
            assert name == o.name.lower() and elem == (OID.CHAR if o == OID.NAME else 0), o
    assert {catalog[o][0] for o in NUMBERS} == {"int2", "int4", "int8", "oid", "float4", "float8", "numeric"}


def test_every_named_oid_names_its_postgres_type_and_the_aliases_are_all_reg_types(source_db: Database) -> None:
    names = dict(source_db.execute("SELECT oid::int, typname FROM pg_type WHERE oid = ANY(%s)",
                                   ([int(o) for o in NamedOID],)))
    for o in NamedOID:
        element = o.name.removesuffix("_ARRAY").lower()
        assert names.get(o) == (element if element == o.name.lower() else "_" + element), o
    aliases = source_db.execute("SELECT oid::int FROM pg_type WHERE typname ~ '^reg' AND typtype = 'b' "
                                "AND typelem = 0")
    assert {r[0] for r in aliases} == set(OID_ALIASES)
    user = source_db.execute("SELECT count(*) FROM pg_type WHERE oid >= %s AND typnamespace = "
                             "'pg_catalog'::regnamespace", (FIRST_USER_OID,))
    assert user == [(0,)]  # no built-in type at or above it


def test_every_array_type_is_an_array_for_the_decoder_the_json_writer_and_spark() -> None:
    for array, element in ARRAY_ELEMENT.items():
        assert converter(array)(b"{NULL}") == [None], array
        assert fragment_for(array)(b"{NULL}") == "[null]", array
        assert spark_type(array) == T.ArrayType(spark_type(element)), array
    assert spark_type(OID.BPCHAR_ARRAY) == T.ArrayType(T.StringType())  # was a plain string before oids.py
