"""The catalog clients see: pg_catalog and information_schema, built from the policy.

psql's `\\dt`, SQLAlchemy's `has_table`, asyncpg's type introspection and friends ask
PostgreSQL's catalog what exists. dpproxy answers those statements from a small in-memory
DuckDB generated from the policy, holding only the tables and columns the analyst was
granted; the data backend is never touched and sizes never appear (`reltuples`,
`pg_*_size` are NULL, statistics views do not exist).

A statement goes to the catalog only when every relation it reads is a catalog relation
(or it reads none and calls catalog functions such as `version()`). It then passes through
a short pipeline of tree passes:

1. `_route`       which relations it reads; statistics views raise 42P01
2. `_normalize`   PostgreSQL-only syntax to plain SQL: `OPERATOR(pg_catalog.~)`, `COLLATE`,
                  `E'…'` strings, LIKE's default escape, `pg_catalog.` function prefixes
3. `_Typer`       PostgreSQL's output column names and types, before anything is renamed
4. `_ToDuckDB`    catalog relations and functions to the DuckDB schemas and macros, reg*
                  casts (`'adult'::regclass`, `oid::regtype::text`) to lookups
5. per call       parameters bound as literals, session functions (`current_setting`,
                  `set_config`, `pg_backend_pid`) replaced by their values, then run

An unknown catalog relation or a shape DuckDB cannot run gets an empty result with the
query's column names and a log line, never a pass-through.

>>> pg_type_name(exp.DataType.build("oid[]", dialect=CatalogPostgres))
'_oid'
>>> output_names("SELECT c.relname, NULL::pg_catalog.text, count(*) FROM pg_class c")
('relname', 'text', 'count')
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import itertools
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.tokens import TokenType

from ..errors import (
    Error,
    NotSupportedError,
    ProgramLimitExceeded,
    ProgrammingError,
    UndefinedObject,
    UndefinedTable,
)
from ..parse import DpPostgres, bind_parameters, parse_statements, split_statements, to_literal
from ..policy import AnalystPolicy, Policy
from ..session import Description, Result
from .codec import array_items
from .jobs import QueryCanceled, current_job
from .keywords import keyword_rows

log = logging.getLogger("dpproxy.catalog")

# -- types ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PgType:
    """One row of pg_type, with how dpproxy stores its values in DuckDB."""

    oid: int
    name: str
    length: int
    byval: bool
    category: str
    array: int  # oid of the array type, 0 when none
    display: str  # format_type()'s spelling
    duck: str  # DuckDB type for columns of this type
    elem: int = 0
    kind: str = "b"  # typtype: b base, p pseudo


# oid, name, typlen, typbyval, typcategory, array oid, format_type name, DuckDB type
_BASE_TYPES: tuple[tuple[int, str, int, bool, str, int, str, str], ...] = (
    (16, "bool", 1, True, "B", 1000, "boolean", "BOOLEAN"),
    (17, "bytea", -1, False, "U", 1001, "bytea", "BLOB"),
    (18, "char", 1, True, "Z", 1002, '"char"', "VARCHAR"),
    (19, "name", 64, False, "S", 1003, "name", "VARCHAR"),
    (20, "int8", 8, True, "N", 1016, "bigint", "BIGINT"),
    (21, "int2", 2, True, "N", 1005, "smallint", "SMALLINT"),
    (23, "int4", 4, True, "N", 1007, "integer", "INTEGER"),
    (24, "regproc", 4, True, "N", 1008, "regproc", "VARCHAR"),  # stored as the name
    (25, "text", -1, False, "S", 1009, "text", "VARCHAR"),
    (26, "oid", 4, True, "N", 1028, "oid", "UINTEGER"),
    (27, "tid", 6, False, "U", 1010, "tid", "VARCHAR"),
    (28, "xid", 4, True, "U", 1011, "xid", "UINTEGER"),
    (29, "cid", 4, True, "U", 1012, "cid", "UINTEGER"),
    (114, "json", -1, False, "U", 199, "json", "VARCHAR"),
    (142, "xml", -1, False, "U", 143, "xml", "VARCHAR"),
    (194, "pg_node_tree", -1, False, "Z", 0, "pg_node_tree", "VARCHAR"),
    (700, "float4", 4, True, "N", 1021, "real", "FLOAT"),
    (701, "float8", 8, True, "N", 1022, "double precision", "DOUBLE"),
    (869, "inet", -1, False, "I", 1041, "inet", "VARCHAR"),
    (1033, "aclitem", 12, False, "U", 1034, "aclitem", "VARCHAR"),
    (1042, "bpchar", -1, False, "S", 1014, "character", "VARCHAR"),
    (1043, "varchar", -1, False, "S", 1015, "character varying", "VARCHAR"),
    (1082, "date", 4, True, "D", 1182, "date", "DATE"),
    (1083, "time", 8, True, "D", 1183, "time without time zone", "TIME"),
    (1114, "timestamp", 8, True, "D", 1115, "timestamp without time zone", "TIMESTAMP"),
    (1184, "timestamptz", 8, True, "D", 1185, "timestamp with time zone", "TIMESTAMPTZ"),
    (1186, "interval", 16, False, "T", 1187, "interval", "INTERVAL"),
    (1266, "timetz", 12, False, "D", 1270, "time with time zone", "TIMETZ"),
    (1700, "numeric", -1, False, "N", 1231, "numeric", "DOUBLE"),
    (2202, "regprocedure", 4, True, "N", 2207, "regprocedure", "UINTEGER"),
    (2203, "regoper", 4, True, "N", 2208, "regoper", "UINTEGER"),
    (2204, "regoperator", 4, True, "N", 2209, "regoperator", "UINTEGER"),
    (2205, "regclass", 4, True, "N", 2210, "regclass", "UINTEGER"),
    (2206, "regtype", 4, True, "N", 2211, "regtype", "UINTEGER"),
    (2950, "uuid", 16, False, "U", 2951, "uuid", "UUID"),
    (3802, "jsonb", -1, False, "U", 3807, "jsonb", "VARCHAR"),
    (4089, "regnamespace", 4, True, "N", 4090, "regnamespace", "UINTEGER"),
    (4096, "regrole", 4, True, "N", 4097, "regrole", "UINTEGER"),
    (4191, "regcollation", 4, True, "N", 4192, "regcollation", "UINTEGER"),
    (5069, "xid8", 8, True, "U", 271, "xid8", "UBIGINT"),
)
# Types without an array type of their own: vectors (subscriptable, 0-based) and pseudo-types.
_OTHER_TYPES: tuple[PgType, ...] = (
    PgType(22, "int2vector", -1, False, "A", 1006, "int2vector", "SMALLINT[]", elem=21),
    PgType(30, "oidvector", -1, False, "A", 1013, "oidvector", "UINTEGER[]", elem=26),
    PgType(705, "unknown", -2, False, "X", 0, "unknown", "VARCHAR", kind="p"),
    PgType(2249, "record", -1, False, "P", 2287, "record", "VARCHAR", kind="p"),
    PgType(2275, "cstring", -2, False, "P", 1263, "cstring", "VARCHAR", kind="p"),
    PgType(2276, "any", 4, True, "P", 0, '"any"', "VARCHAR", kind="p"),
    PgType(2277, "anyarray", -1, False, "P", 0, "anyarray", "VARCHAR", kind="p"),
    PgType(2278, "void", 4, True, "P", 0, "void", "VARCHAR", kind="p"),
    PgType(2279, "trigger", 4, True, "P", 0, "trigger", "VARCHAR", kind="p"),
    PgType(2281, "internal", 8, True, "P", 0, "internal", "VARCHAR", kind="p"),
    PgType(2283, "anyelement", 4, True, "P", 0, "anyelement", "VARCHAR", kind="p"),
)


def _all_types() -> tuple[PgType, ...]:
    types = [PgType(oid, name, length, byval, category, array, display, duck)
             for oid, name, length, byval, category, array, display, duck in _BASE_TYPES]
    types += _OTHER_TYPES
    element_of = {t.array: t for t in types if t.array}
    types += [PgType(array_oid, f"_{t.name}", -1, False, "A", 0, f"{t.display}[]",
                     f"{t.duck}[]", elem=t.oid, kind=t.kind if t.kind == "p" else "b")
              for array_oid, t in element_of.items()]
    return tuple(sorted(types, key=lambda t: t.oid))


TYPES: tuple[PgType, ...] = _all_types()
TYPES_BY_NAME: dict[str, PgType] = {t.name: t for t in TYPES}
TYPE_OIDS: dict[str, int] = {t.name: t.oid for t in TYPES}
"""PostgreSQL type name → pg_type oid, for every type a catalog result can carry."""

REG_TYPES = frozenset({"regclass", "regtype", "regnamespace", "regrole", "regproc",
                       "regprocedure", "regoper", "regoperator", "regcollation"})
_TEXT_TYPES = frozenset({"text", "varchar", "name", "bpchar", "char", "unknown"})
_POLICY_TYPES = {"int": "int8", "float": "float8", "text": "text", "date": "date",
                 "bool": "bool"}
_SQLGLOT_TYPES = {  # sqlglot type → PostgreSQL type name
    exp.DType.BIGINT: "int8", exp.DType.INT: "int4", exp.DType.SMALLINT: "int2",
    exp.DType.TEXT: "text", exp.DType.VARCHAR: "varchar", exp.DType.CHAR: "bpchar",
    exp.DType.NCHAR: "bpchar", exp.DType.NVARCHAR: "varchar", exp.DType.NAME: "name",
    exp.DType.BOOLEAN: "bool", exp.DType.DOUBLE: "float8", exp.DType.FLOAT: "float4",
    exp.DType.DECIMAL: "numeric", exp.DType.DATE: "date", exp.DType.TIME: "time",
    exp.DType.TIMETZ: "timetz", exp.DType.TIMESTAMP: "timestamp",
    exp.DType.TIMESTAMPTZ: "timestamptz", exp.DType.INTERVAL: "interval",
    exp.DType.JSON: "json", exp.DType.JSONB: "jsonb", exp.DType.UUID: "uuid",
    exp.DType.VARBINARY: "bytea", exp.DType.BINARY: "bytea", exp.DType.INET: "inet",
    exp.DType.XML: "xml",
}
_DUCKDB_TYPES = {  # DuckDB result type → PostgreSQL type name, when the tree does not say
    "BOOLEAN": "bool", "TINYINT": "int2", "SMALLINT": "int2", "INTEGER": "int4",
    "BIGINT": "int8", "HUGEINT": "numeric", "UTINYINT": "int2", "USMALLINT": "int4",
    "UINTEGER": "oid", "UBIGINT": "int8", "FLOAT": "float4", "DOUBLE": "float8",
    "VARCHAR": "text", "DATE": "date", "TIME": "time", "TIMESTAMP": "timestamp",
    "TIMESTAMP WITH TIME ZONE": "timestamptz", "INTERVAL": "interval", "BLOB": "bytea",
    "UUID": "uuid", "JSON": "json",
}


class CatalogPostgres(DpPostgres):
    """PostgreSQL as catalog SQL writes it: `$1::oid[]`, `x::regclass[]` parse as arrays."""

    class Parser(DpPostgres.Parser):
        def _parse_types(self, *args: Any, **kwargs: Any) -> exp.Expression | None:
            this = super()._parse_types(*args, **kwargs)
            if isinstance(this, exp.ObjectIdentifier | exp.PseudoType):
                while self._match_pair(TokenType.L_BRACKET, TokenType.R_BRACKET):
                    this = exp.DataType(this=exp.DType.ARRAY, expressions=[this], nested=True)
            return this


def pg_type_name(node: exp.Expression) -> str:
    """The PostgreSQL name of a type in a cast: `pg_catalog.int2[]` → `_int2`."""
    if isinstance(node, exp.ObjectIdentifier | exp.PseudoType):
        return str(node.this).lower()
    if not isinstance(node, exp.DataType):
        return node.sql("postgres").lower()
    if node.this == exp.DType.ARRAY and node.expressions:
        return "_" + pg_type_name(node.expressions[0])
    if node.this == exp.DType.USERDEFINED:
        kind = node.args.get("kind")
        last = kind.expression if isinstance(kind, exp.Dot) else kind
        name = last.name if isinstance(last, exp.Expression) else str(kind)
        return name if isinstance(last, exp.Identifier) and last.quoted else name.lower()
    known = _SQLGLOT_TYPES.get(node.this)  # type: ignore[call-overload]
    return known if known is not None else node.sql("postgres").lower()


def _duck_type_sql(pg_type: str) -> str:
    known = TYPES_BY_NAME.get(pg_type)
    return known.duck if known else "VARCHAR"


@functools.lru_cache(maxsize=256)
def _duck_type_node(pg_type: str) -> exp.DataType:
    return exp.DataType.build(_duck_type_sql(pg_type), dialect="duckdb")


def _duck_type(pg_type: str) -> exp.DataType:
    """The DuckDB type storing a PostgreSQL type (a fresh node, to put in a tree)."""
    return _duck_type_node(pg_type).copy()


def _element_type(pg_type: str | None) -> str | None:
    if not pg_type:
        return None
    known = TYPES_BY_NAME.get(pg_type)
    if known is None or not known.elem:
        return None
    return next(t.name for t in TYPES if t.oid == known.elem)


def _array_type(pg_type: str | None) -> str | None:
    known = TYPES_BY_NAME.get(pg_type or "")
    if known is None or not known.array:
        return None
    return next(t.name for t in TYPES if t.oid == known.array)


# -- catalog relations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A table or view as pg_class and pg_attribute show it."""

    schema: str
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type)
    kind: str = "r"  # relkind
    not_null: frozenset[str] = frozenset()
    oid: int = 0


_ACL = "_aclitem"
# schema.name (view when starred): "column type, …", PostgreSQL 15's columns.
_CATALOG_SPEC: dict[str, str] = {
    "pg_catalog.pg_am": "oid oid, amname name, amhandler regproc, amtype char",
    "pg_catalog.pg_attrdef": "oid oid, adrelid oid, adnum int2, adbin pg_node_tree",
    "pg_catalog.pg_attribute": (
        "attrelid oid, attname name, atttypid oid, attstattarget int4, attlen int2, "
        "attnum int2, attndims int4, attcacheoff int4, atttypmod int4, attbyval bool, "
        "attalign char, attstorage char, attcompression char, attnotnull bool, "
        "atthasdef bool, atthasmissing bool, attidentity char, attgenerated char, "
        "attisdropped bool, attislocal bool, attinhcount int4, attcollation oid, "
        f"attacl {_ACL}, attoptions _text, attfdwoptions _text"),
    "pg_catalog.pg_auth_members": "roleid oid, member oid, grantor oid, admin_option bool",
    "pg_catalog.pg_authid": (
        "oid oid, rolname name, rolsuper bool, rolinherit bool, rolcreaterole bool, "
        "rolcreatedb bool, rolcanlogin bool, rolreplication bool, rolbypassrls bool, "
        "rolconnlimit int4, rolpassword text, rolvaliduntil timestamptz"),
    "pg_catalog.pg_class": (
        "oid oid, relname name, relnamespace oid, reltype oid, reloftype oid, relowner oid, "
        "relam oid, relfilenode oid, reltablespace oid, relpages int4, reltuples float4, "
        "relallvisible int4, reltoastrelid oid, relhasindex bool, relisshared bool, "
        "relpersistence char, relkind char, relnatts int2, relchecks int2, "
        "relhasrules bool, relhastriggers bool, relhassubclass bool, relrowsecurity bool, "
        "relforcerowsecurity bool, relispopulated bool, relreplident char, "
        "relispartition bool, relrewrite oid, relfrozenxid xid, relminmxid xid, "
        f"relacl {_ACL}, reloptions _text, relpartbound pg_node_tree"),
    "pg_catalog.pg_collation": (
        "oid oid, collname name, collnamespace oid, collowner oid, collprovider char, "
        "collisdeterministic bool, collencoding int4, collcollate text, collctype text, "
        "colliculocale text, collversion text"),
    "pg_catalog.pg_constraint": (
        "oid oid, conname name, connamespace oid, contype char, condeferrable bool, "
        "condeferred bool, convalidated bool, conrelid oid, contypid oid, conindid oid, "
        "conparentid oid, confrelid oid, confupdtype char, confdeltype char, "
        "confmatchtype char, conislocal bool, coninhcount int4, connoinherit bool, "
        "conkey _int2, confkey _int2, conpfeqop _oid, conppeqop _oid, conffeqop _oid, "
        "confdelsetcols _int2, conexclop _oid, conbin pg_node_tree"),
    "pg_catalog.pg_database": (
        "oid oid, datname name, datdba oid, encoding int4, datlocprovider char, "
        "datistemplate bool, datallowconn bool, datconnlimit int4, datfrozenxid xid, "
        "datminmxid xid, dattablespace oid, datcollate text, datctype text, "
        f"daticulocale text, datcollversion text, datacl {_ACL}"),
    "pg_catalog.pg_default_acl": (
        "oid oid, defaclrole oid, defaclnamespace oid, defaclobjtype char, "
        f"defaclacl {_ACL}"),
    "pg_catalog.pg_depend": (
        "classid oid, objid oid, objsubid int4, refclassid oid, refobjid oid, "
        "refobjsubid int4, deptype char"),
    "pg_catalog.pg_description": "objoid oid, classoid oid, objsubid int4, description text",
    "pg_catalog.pg_enum": "oid oid, enumtypid oid, enumsortorder float4, enumlabel name",
    "pg_catalog.pg_event_trigger": (
        "oid oid, evtname name, evtevent name, evtowner oid, evtfoid oid, evtenabled char, "
        "evttags _text"),
    "pg_catalog.pg_extension": (
        "oid oid, extname name, extowner oid, extnamespace oid, extrelocatable bool, "
        "extversion text, extconfig _oid, extcondition _text"),
    "pg_catalog.pg_foreign_server": (
        "oid oid, srvname name, srvowner oid, srvfdw oid, srvtype text, srvversion text, "
        f"srvacl {_ACL}, srvoptions _text"),
    "pg_catalog.pg_foreign_table": "ftrelid oid, ftserver oid, ftoptions _text",
    "pg_catalog.pg_index": (
        "indexrelid oid, indrelid oid, indnatts int2, indnkeyatts int2, indisunique bool, "
        "indnullsnotdistinct bool, indisprimary bool, indisexclusion bool, "
        "indimmediate bool, indisclustered bool, indisvalid bool, indcheckxmin bool, "
        "indisready bool, indislive bool, indisreplident bool, indkey int2vector, "
        "indcollation oidvector, indclass oidvector, indoption int2vector, "
        "indexprs pg_node_tree, indpred pg_node_tree"),
    "pg_catalog.pg_inherits": (
        "inhrelid oid, inhparent oid, inhseqno int4, inhdetachpending bool"),
    "pg_catalog.pg_language": (
        "oid oid, lanname name, lanowner oid, lanispl bool, lanpltrusted bool, "
        f"lanplcallfoid oid, laninline oid, lanvalidator oid, lanacl {_ACL}"),
    "pg_catalog.pg_namespace": f"oid oid, nspname name, nspowner oid, nspacl {_ACL}",
    "pg_catalog.pg_opclass": (
        "oid oid, opcmethod oid, opcname name, opcnamespace oid, opcowner oid, "
        "opcfamily oid, opcintype oid, opcdefault bool, opckeytype oid"),
    "pg_catalog.pg_partitioned_table": (
        "partrelid oid, partstrat char, partnatts int2, partdefid oid, "
        "partattrs int2vector, partclass oidvector, partcollation oidvector, "
        "partexprs pg_node_tree"),
    "pg_catalog.pg_policy": (
        "oid oid, polname name, polrelid oid, polcmd char, polpermissive bool, "
        "polroles _oid, polqual pg_node_tree, polwithcheck pg_node_tree"),
    "pg_catalog.pg_proc": (
        "oid oid, proname name, pronamespace oid, proowner oid, prolang oid, "
        "procost float4, prorows float4, provariadic oid, prosupport regproc, "
        "prokind char, prosecdef bool, proleakproof bool, proisstrict bool, "
        "proretset bool, provolatile char, proparallel char, pronargs int2, "
        "pronargdefaults int2, prorettype oid, proargtypes oidvector, "
        "proallargtypes _oid, proargmodes _char, proargnames _text, "
        "proargdefaults pg_node_tree, protrftypes _oid, prosrc text, probin text, "
        f"prosqlbody pg_node_tree, proconfig _text, proacl {_ACL}"),
    "pg_catalog.pg_publication": (
        "oid oid, pubname name, pubowner oid, puballtables bool, pubinsert bool, "
        "pubupdate bool, pubdelete bool, pubtruncate bool, pubviaroot bool"),
    "pg_catalog.pg_publication_namespace": "oid oid, pnpubid oid, pnnspid oid",
    "pg_catalog.pg_publication_rel": (
        "oid oid, prpubid oid, prrelid oid, prqual pg_node_tree, prattrs int2vector"),
    "pg_catalog.pg_range": (
        "rngtypid oid, rngsubtype oid, rngmultitypid oid, rngcollation oid, "
        "rngsubopc oid, rngcanonical regproc, rngsubdiff regproc"),
    "pg_catalog.pg_rewrite": (
        "oid oid, rulename name, ev_class oid, ev_type char, ev_enabled char, "
        "is_instead bool, ev_qual pg_node_tree, ev_action pg_node_tree"),
    "pg_catalog.pg_sequence": (
        "seqrelid oid, seqtypid oid, seqstart int8, seqincrement int8, seqmax int8, "
        "seqmin int8, seqcache int8, seqcycle bool"),
    "pg_catalog.pg_shdescription": "objoid oid, classoid oid, description text",
    "pg_catalog.pg_statistic_ext": (
        "oid oid, stxrelid oid, stxname name, stxnamespace oid, stxowner oid, "
        "stxstattarget int4, stxkeys int2vector, stxkind _char, stxexprs pg_node_tree"),
    "pg_catalog.pg_tablespace": (
        f"oid oid, spcname name, spcowner oid, spcacl {_ACL}, spcoptions _text"),
    "pg_catalog.pg_trigger": (
        "oid oid, tgrelid oid, tgparentid oid, tgname name, tgfoid oid, tgtype int2, "
        "tgenabled char, tgisinternal bool, tgconstrrelid oid, tgconstrindid oid, "
        "tgconstraint oid, tgdeferrable bool, tginitdeferred bool, tgnargs int2, "
        "tgattr int2vector, tgargs bytea, tgqual pg_node_tree, tgoldtable name, "
        "tgnewtable name"),
    "pg_catalog.pg_type": (
        "oid oid, typname name, typnamespace oid, typowner oid, typlen int2, "
        "typbyval bool, typtype char, typcategory char, typispreferred bool, "
        "typisdefined bool, typdelim char, typrelid oid, typsubscript regproc, "
        "typelem oid, typarray oid, typinput regproc, typoutput regproc, "
        "typreceive regproc, typsend regproc, typmodin regproc, typmodout regproc, "
        "typanalyze regproc, typalign char, typstorage char, typnotnull bool, "
        "typbasetype oid, typtypmod int4, typndims int4, typcollation oid, "
        f"typdefaultbin pg_node_tree, typdefault text, typacl {_ACL}"),
    "pg_catalog.pg_indexes*": (
        "schemaname name, tablename name, indexname name, tablespace name, indexdef text"),
    "pg_catalog.pg_matviews*": (
        "schemaname name, matviewname name, matviewowner name, tablespace name, "
        "hasindexes bool, ispopulated bool, definition text"),
    "pg_catalog.pg_roles*": (
        "rolname name, rolsuper bool, rolinherit bool, rolcreaterole bool, "
        "rolcreatedb bool, rolcanlogin bool, rolreplication bool, rolconnlimit int4, "
        "rolpassword text, rolvaliduntil timestamptz, rolbypassrls bool, "
        "rolconfig _text, oid oid"),
    "pg_catalog.pg_sequences*": (
        "schemaname name, sequencename name, sequenceowner name, data_type regtype, "
        "start_value int8, min_value int8, max_value int8, increment_by int8, cycle bool, "
        "cache_size int8, last_value int8"),
    "pg_catalog.pg_settings*": (
        "name text, setting text, unit text, category text, short_desc text, "
        "extra_desc text, context text, vartype text, source text, min_val text, "
        "max_val text, enumvals _text, boot_val text, reset_val text, sourcefile text, "
        "sourceline int4, pending_restart bool"),
    "pg_catalog.pg_tables*": (
        "schemaname name, tablename name, tableowner name, tablespace name, "
        "hasindexes bool, hasrules bool, hastriggers bool, rowsecurity bool"),
    "pg_catalog.pg_user*": (
        "usename name, usesysid oid, usecreatedb bool, usesuper bool, userepl bool, "
        "usebypassrls bool, passwd text, valuntil timestamptz, useconfig _text"),
    "pg_catalog.pg_views*": "schemaname name, viewname name, viewowner name, definition text",
    "information_schema.columns*": (
        "table_catalog name, table_schema name, table_name name, column_name name, "
        "ordinal_position int4, column_default varchar, is_nullable varchar, "
        "data_type varchar, character_maximum_length int4, character_octet_length int4, "
        "numeric_precision int4, numeric_precision_radix int4, numeric_scale int4, "
        "datetime_precision int4, interval_type varchar, interval_precision int4, "
        "character_set_catalog name, character_set_schema name, character_set_name name, "
        "collation_catalog name, collation_schema name, collation_name name, "
        "domain_catalog name, domain_schema name, domain_name name, udt_catalog name, "
        "udt_schema name, udt_name name, scope_catalog name, scope_schema name, "
        "scope_name name, maximum_cardinality int4, dtd_identifier name, "
        "is_self_referencing varchar, is_identity varchar, identity_generation varchar, "
        "identity_start varchar, identity_increment varchar, identity_maximum varchar, "
        "identity_minimum varchar, identity_cycle varchar, is_generated varchar, "
        "generation_expression varchar, is_updatable varchar"),
    "information_schema.constraint_column_usage*": (
        "table_catalog name, table_schema name, table_name name, column_name name, "
        "constraint_catalog name, constraint_schema name, constraint_name name"),
    "information_schema.enabled_roles*": "role_name name",
    "information_schema.key_column_usage*": (
        "constraint_catalog name, constraint_schema name, constraint_name name, "
        "table_catalog name, table_schema name, table_name name, column_name name, "
        "ordinal_position int4, position_in_unique_constraint int4"),
    "information_schema.referential_constraints*": (
        "constraint_catalog name, constraint_schema name, constraint_name name, "
        "unique_constraint_catalog name, unique_constraint_schema name, "
        "unique_constraint_name name, match_option varchar, update_rule varchar, "
        "delete_rule varchar"),
    "information_schema.schemata*": (
        "catalog_name name, schema_name name, schema_owner name, "
        "default_character_set_catalog name, default_character_set_schema name, "
        "default_character_set_name name, sql_path varchar"),
    "information_schema.sequences*": (
        "sequence_catalog name, sequence_schema name, sequence_name name, "
        "data_type varchar, numeric_precision int4, numeric_precision_radix int4, "
        "numeric_scale int4, start_value varchar, minimum_value varchar, "
        "maximum_value varchar, increment varchar, cycle_option varchar"),
    "information_schema.table_constraints*": (
        "constraint_catalog name, constraint_schema name, constraint_name name, "
        "table_catalog name, table_schema name, table_name name, constraint_type varchar, "
        "is_deferrable varchar, initially_deferred varchar, enforced varchar, "
        "nulls_distinct varchar"),
    "information_schema.table_privileges*": (
        "grantor name, grantee name, table_catalog name, table_schema name, "
        "table_name name, privilege_type varchar, is_grantable varchar, "
        "with_hierarchy varchar"),
    "information_schema.tables*": (
        "table_catalog name, table_schema name, table_name name, table_type varchar, "
        "self_referencing_column_name name, reference_generation varchar, "
        "user_defined_type_catalog name, user_defined_type_schema name, "
        "user_defined_type_name name, is_insertable_into varchar, is_typed varchar, "
        "commit_action varchar"),
    "information_schema.views*": (
        "table_catalog name, table_schema name, table_name name, view_definition varchar, "
        "check_option varchar, is_updatable varchar, is_insertable_into varchar, "
        "is_trigger_updatable varchar, is_trigger_deletable varchar, "
        "is_trigger_insertable_into varchar"),
}
# PostgreSQL's own oids for the catalog tables clients name in regclass casts and joins.
_CATALOG_OIDS = {
    "pg_type": 1247, "pg_attribute": 1249, "pg_proc": 1255, "pg_class": 1259,
    "pg_authid": 1260, "pg_auth_members": 1261, "pg_database": 1262, "pg_tablespace": 1213,
    "pg_sequence": 2224, "pg_shdescription": 2396, "pg_am": 2601, "pg_attrdef": 2604,
    "pg_constraint": 2606, "pg_depend": 2608, "pg_description": 2609, "pg_index": 2610,
    "pg_inherits": 2611, "pg_language": 2612, "pg_namespace": 2615, "pg_opclass": 2616,
    "pg_rewrite": 2618, "pg_trigger": 2620, "pg_extension": 3079, "pg_foreign_table": 3118,
    "pg_policy": 3256, "pg_partitioned_table": 3350, "pg_statistic_ext": 3381,
    "pg_collation": 3456, "pg_event_trigger": 3466, "pg_enum": 3501, "pg_range": 3541,
    "pg_default_acl": 826, "pg_foreign_server": 1417, "pg_publication": 6104,
    "pg_publication_rel": 6106, "pg_publication_namespace": 6237,
}
NAMESPACE_OIDS = {"pg_catalog": 11, "public": 2200, "information_schema": 13000}
_DUCK_SCHEMAS = {"pg_catalog": "pgcat", "information_schema": "infoschema"}
SUPERUSER_OID = 10
SUPERUSER = "dpproxy"  # owns the tables, schemas and database
ANALYST_ROLE_OID = 16384
DATABASE_OID = 16385
FIRST_TABLE_OID = 16386
_VIEW_OIDS = itertools.count(12000)


def _catalog_relations() -> tuple[Relation, ...]:
    relations = []
    for key, spec in _CATALOG_SPEC.items():
        schema, name = key.rstrip("*").split(".")
        columns = tuple(tuple(c.split()) for c in spec.split(", "))
        oid = _CATALOG_OIDS.get(name) or next(_VIEW_OIDS)
        relations.append(Relation(schema, name, columns,  # type: ignore[arg-type]
                                  "v" if key.endswith("*") else "r", oid=oid))
    return tuple(relations)


CATALOG_RELATIONS: tuple[Relation, ...] = _catalog_relations()
_CATALOG_BY_NAME: dict[tuple[str, str], Relation] = {
    (r.schema, r.name): r for r in CATALOG_RELATIONS}


def is_statistics_relation(name: str) -> bool:
    """pg_stat*, pg_statio*, pg_stats, pg_statistic: they would reveal sizes and values."""
    return name.startswith("pg_stat") and name != "pg_statistic_ext"


# -- settings ---------------------------------------------------------------------------------

_SETTINGS: dict[str, str] = {
    "application_name": "", "bytea_output": "hex", "client_encoding": "UTF8",
    "client_min_messages": "notice", "DateStyle": "ISO, MDY",
    "default_transaction_deferrable": "off",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "on", "extra_float_digits": "1",
    "idle_in_transaction_session_timeout": "0", "in_hot_standby": "off",
    "integer_datetimes": "on", "IntervalStyle": "postgres", "is_superuser": "off",
    "jit": "off", "lc_collate": "C.UTF-8", "lc_ctype": "C.UTF-8", "lc_messages": "C",
    "lc_monetary": "C", "lc_numeric": "C", "lc_time": "C", "lock_timeout": "0",
    "max_identifier_length": "63", "max_index_keys": "32", "row_security": "on",
    "search_path": '"$user", public', "server_encoding": "UTF8",
    "standard_conforming_strings": "on", "statement_timeout": "0", "TimeZone": "UTC",
    "timezone_abbreviations": "Default", "transaction_deferrable": "off",
    "transaction_isolation": "read committed", "transaction_read_only": "on",
    # read by clients beyond the startup parameters: SQLAlchemy's table reflection, pgAdmin's
    # database properties, libpq's PQencryptPasswordConn (psql's \password)
    "default_table_access_method": "heap", "default_tablespace": "",
    "password_encryption": "scram-sha-256",
}
# SHOW's multi-word spellings.
_SHOW_ALIASES = {"transaction isolation level": "transaction_isolation",
                 "time zone": "timezone", "session authorization": "session_authorization"}


def server_version_num(version: str) -> str:
    """`15.4` → `150004`, as PostgreSQL ≥ 10 numbers its versions."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0]
    return str(parts[0] * 10000 + parts[1])


# -- the catalog database ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Identity:
    """Everything a catalog database depends on; equal identities share one database."""

    database: str
    user: str
    server_version: str
    tables: tuple[Relation, ...]  # the granted policy tables, in policy order


def _granted_tables(policy: Policy, analyst: AnalystPolicy) -> tuple[Relation, ...]:
    granted = [t for name, t in policy.tables.items() if name in analyst.tables]
    return tuple(
        Relation("public", t.name,
                 tuple((c.name, _POLICY_TYPES[c.type]) for c in t.columns.values()),
                 not_null=frozenset(c.name for c in t.columns.values() if not c.nullable),
                 oid=FIRST_TABLE_OID + i)
        for i, t in enumerate(granted))


def _settings(identity: _Identity) -> dict[str, str]:
    return {**_SETTINGS, "server_version": identity.server_version,
            "server_version_num": server_version_num(identity.server_version),
            "session_authorization": identity.user}


def _quote_ident(name: str) -> str:
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else '"' + name.replace('"', '""') + '"'


def _row(relation: Relation, values: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(values.get(column) for column, _ in relation.columns)


def _catalog_rows(identity: _Identity) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """The rows of every catalog relation for one identity (absent relations are empty)."""
    rel = _CATALOG_BY_NAME
    relations = identity.tables + CATALOG_RELATIONS
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in rel}

    def add(schema: str, relation: str, /, **values: Any) -> None:
        rows[(schema, relation)].append(values)

    for nsp, oid in NAMESPACE_OIDS.items():
        add("pg_catalog", "pg_namespace", oid=oid, nspname=nsp, nspowner=SUPERUSER_OID)
        add("information_schema", "schemata", catalog_name=identity.database,
            schema_name=nsp, schema_owner=SUPERUSER)
    for oid, name, superuser, login in ((SUPERUSER_OID, SUPERUSER, True, False),
                                        (ANALYST_ROLE_OID, identity.user, False, True)):
        flags = dict(rolsuper=superuser, rolinherit=True, rolcreaterole=superuser,
                     rolcreatedb=superuser, rolcanlogin=login, rolreplication=False,
                     rolbypassrls=False, rolconnlimit=-1)
        add("pg_catalog", "pg_authid", oid=oid, rolname=name, **flags)
        add("pg_catalog", "pg_roles", oid=oid, rolname=name, rolpassword="********", **flags)
        add("pg_catalog", "pg_user", usename=name, usesysid=oid, usecreatedb=superuser,
            usesuper=superuser, userepl=False, usebypassrls=False, passwd="********")
    add("information_schema", "enabled_roles", role_name=identity.user)
    add("pg_catalog", "pg_database", oid=DATABASE_OID, datname=identity.database,
        datdba=SUPERUSER_OID, encoding=6, datlocprovider="c", datistemplate=False,
        datallowconn=True, datconnlimit=-1, dattablespace=1663, datcollate="C.UTF-8",
        datctype="C.UTF-8")
    add("pg_catalog", "pg_am", oid=2, amname="heap", amhandler="heap_tableam_handler",
        amtype="t")
    add("pg_catalog", "pg_am", oid=403, amname="btree", amhandler="bthandler", amtype="i")
    for oid, name in ((1663, "pg_default"), (1664, "pg_global")):
        add("pg_catalog", "pg_tablespace", oid=oid, spcname=name, spcowner=SUPERUSER_OID)
    for oid, name, provider in ((100, "default", "d"), (950, "C", "c"), (951, "POSIX", "c")):
        add("pg_catalog", "pg_collation", oid=oid, collname=name, collnamespace=11,
            collowner=SUPERUSER_OID, collprovider=provider, collisdeterministic=True,
            collencoding=-1, collcollate=None if provider == "d" else name,
            collctype=None if provider == "d" else name)
    for oid, name in ((12, "internal"), (13, "c"), (14, "sql")):
        add("pg_catalog", "pg_language", oid=oid, lanname=name, lanowner=SUPERUSER_OID,
            lanispl=False, lanpltrusted=name == "sql", lanplcallfoid=0, laninline=0,
            lanvalidator=0)
    for t in TYPES:
        array = t.name.startswith("_")
        add("pg_catalog", "pg_type", oid=t.oid, typname=t.name, typnamespace=11,
            typowner=SUPERUSER_OID, typlen=t.length, typbyval=t.byval, typtype=t.kind,
            typcategory=t.category, typispreferred=t.name in ("text", "float8", "oid", "bool"),
            typisdefined=True, typdelim=",", typrelid=0,
            typsubscript="array_subscript_handler" if t.elem else "-", typelem=t.elem,
            typarray=t.array, typinput="array_in" if array else f"{t.name}in",
            typoutput="array_out" if array else f"{t.name}out",
            typreceive="array_recv" if array else f"{t.name}recv",
            typsend="array_send" if array else f"{t.name}send", typmodin="-",
            typmodout="-", typanalyze="-",
            typalign={1: "c", 2: "s", 8: "d"}.get(t.length, "i"),
            typstorage="x" if t.length == -1 else "p", typnotnull=False, typbasetype=0,
            typtypmod=-1, typndims=0,
            typcollation={"text": 100, "varchar": 100, "bpchar": 100, "name": 950}.get(t.name, 0))
    settings = _settings(identity)
    for name in sorted(settings, key=str.lower):
        value = settings[name]
        add("pg_catalog", "pg_settings", name=name, setting=value, category="dpproxy",
            short_desc="", context="user", vartype="string", source="default",
            boot_val=value, reset_val=value, pending_restart=False)
    for r in relations:
        _add_relation(add, identity, r)
    return {key: [_row(rel[key], v) for v in values] for key, values in rows.items()}


def _add_relation(add: Callable[..., None], identity: _Identity, r: Relation) -> None:
    namespace = NAMESPACE_OIDS[r.schema]
    table = r.kind == "r"
    add("pg_catalog", "pg_class", oid=r.oid, relname=r.name, relnamespace=namespace,
        reltype=0, reloftype=0, relowner=SUPERUSER_OID, relam=2 if table else 0,
        relfilenode=0, reltablespace=0, reltoastrelid=0, relhasindex=False,
        relisshared=False, relpersistence="p", relkind=r.kind, relnatts=len(r.columns),
        relchecks=0, relhasrules=not table, relhastriggers=False, relhassubclass=False,
        relrowsecurity=False, relforcerowsecurity=False, relispopulated=True,
        relreplident="d" if table else "n", relispartition=False, relrewrite=0)
    if r.kind == "r":
        add("pg_catalog", "pg_tables", schemaname=r.schema, tablename=r.name,
            tableowner=SUPERUSER, hasindexes=False, hasrules=False, hastriggers=False,
            rowsecurity=False)
    else:
        add("pg_catalog", "pg_views", schemaname=r.schema, viewname=r.name,
            viewowner=SUPERUSER)
        add("information_schema", "views", table_catalog=identity.database,
            table_schema=r.schema, table_name=r.name, check_option="NONE",
            is_updatable="NO", is_insertable_into="NO", is_trigger_updatable="NO",
            is_trigger_deletable="NO", is_trigger_insertable_into="NO")
    add("information_schema", "tables", table_catalog=identity.database,
        table_schema=r.schema, table_name=r.name,
        table_type="BASE TABLE" if table else "VIEW", is_insertable_into="NO", is_typed="NO")
    if r.schema == "public":
        add("information_schema", "table_privileges", grantor=SUPERUSER, grantee=identity.user,
            table_catalog=identity.database, table_schema=r.schema, table_name=r.name,
            privilege_type="SELECT", is_grantable="NO", with_hierarchy="YES")
    for number, (column, type_name) in enumerate(r.columns, start=1):
        t = TYPES_BY_NAME[type_name]
        not_null = column in r.not_null
        add("pg_catalog", "pg_attribute", attrelid=r.oid, attname=column, atttypid=t.oid,
            attstattarget=-1, attlen=t.length, attnum=number, attndims=int(t.category == "A"),
            attcacheoff=-1, atttypmod=-1, attbyval=t.byval,
            attalign={1: "c", 2: "s", 8: "d"}.get(t.length, "i"),
            attstorage="x" if t.length == -1 else "p", attcompression="",
            attnotnull=not_null, atthasdef=False, atthasmissing=False, attidentity="",
            attgenerated="", attisdropped=False, attislocal=True, attinhcount=0,
            attcollation=100 if type_name in ("text", "varchar", "bpchar") else 0)
        add("information_schema", "columns", table_catalog=identity.database,
            table_schema=r.schema, table_name=r.name, column_name=column,
            ordinal_position=number, is_nullable="NO" if not_null else "YES",
            data_type="ARRAY" if t.elem else t.display,
            numeric_precision={"int2": 16, "int4": 32, "int8": 64, "float4": 24,
                               "float8": 53}.get(type_name),
            numeric_precision_radix=2 if type_name in ("int2", "int4", "int8", "float4",
                                                       "float8") else None,
            numeric_scale=0 if type_name in ("int2", "int4", "int8") else None,
            datetime_precision=0 if type_name == "date" else None,
            udt_catalog=identity.database, udt_schema="pg_catalog", udt_name=type_name,
            dtd_identifier=str(number), is_self_referencing="NO", is_identity="NO",
            identity_cycle="NO", is_generated="NEVER", is_updatable="NO")


def _literal(value: Any) -> str:
    """A DuckDB literal for a value of the catalog's own data (names from the policy)."""
    return to_literal(value).sql("duckdb")


# Name ⇄ oid lookups behind the reg* casts, format_type() and pg_get_userbyid().
_NAMES = Relation("pg_catalog", "_dp_names",
                  (("kind", "text"), ("spelling", "text"), ("oid", "oid")))
_LABELS = Relation("pg_catalog", "_dp_labels",
                   (("kind", "text"), ("oid", "oid"), ("label", "text")))
# pg_get_keywords()'s rows, which a call in FROM reads (`_table_functions`); not in pg_class
_KEYWORDS = Relation("pg_catalog", "_dp_keywords", (
    ("word", "text"), ("catcode", "text"), ("barelabel", "bool"), ("catdesc", "text"),
    ("baredesc", "text")))
_CATALOG_BY_NAME[(_KEYWORDS.schema, _KEYWORDS.name)] = _KEYWORDS  # read, never listed
_TYPE_ALIASES = {"int": "int4", "integer[]": "_int4", "float": "float8", "decimal": "numeric",
                 "char": "bpchar", "character varying[]": "_varchar"}


def _lookups(identity: _Identity) -> dict[Relation, list[tuple[Any, ...]]]:
    """Rows of the lookup tables: every spelling a reg* input accepts, every output label."""
    names: dict[tuple[str, str], int] = {}
    labels: list[tuple[Any, ...]] = []

    def spell(kind: str, oid: int, *spellings: str) -> None:
        for spelling in spellings:
            names.setdefault((kind, spelling.lower()), oid)

    for r in identity.tables + CATALOG_RELATIONS:
        qualified = f"{r.schema}.{_quote_ident(r.name)}"
        # every quoting of schema and name a client writes ("public"."adult": Metabase's
        # privilege check quotes both)
        spell("class", r.oid, str(r.oid), *(f"{schema}.{name}" for schema in (
            r.schema, f'"{r.schema}"') for name in (r.name, f'"{r.name}"')))
        if r.schema != "information_schema":  # on the search path
            spell("class", r.oid, r.name, f'"{r.name}"')
        labels.append(("class", r.oid, r.name if r.schema != "information_schema"
                       else qualified))
    for t in TYPES:
        spell("type", t.oid, str(t.oid), t.name, t.display, f'"{t.name}"',
              f"pg_catalog.{t.name}", f"pg_catalog.{t.display}")
        if t.name.startswith("_"):
            spell("type", t.oid, f"{t.name[1:]}[]")
        labels.append(("type", t.oid, t.display))
    for alias, name in _TYPE_ALIASES.items():
        spell("type", TYPE_OIDS[name], alias)
    for name, oid in NAMESPACE_OIDS.items():
        spell("namespace", oid, str(oid), name, f'"{name}"')
        labels.append(("namespace", oid, name))
    for oid, name in ((SUPERUSER_OID, SUPERUSER), (ANALYST_ROLE_OID, identity.user)):
        spell("role", oid, str(oid), name, f'"{name}"')
        labels.append(("role", oid, name))
    spell("database", DATABASE_OID, str(DATABASE_OID), identity.database)
    return {_NAMES: [(k, s, o) for (k, s), o in names.items()], _LABELS: labels,
            _KEYWORDS: keyword_rows()}


def _macros(identity: _Identity) -> dict[str, list[tuple[str, str]]]:
    """Catalog functions as DuckDB macros: name → overloads (parameters, body)."""
    version = (f"PostgreSQL {identity.server_version} (dpproxy) on x86_64-pc-linux-gnu, "
               "64-bit")
    null_text, null_int8 = "CAST(NULL AS VARCHAR)", "CAST(NULL AS BIGINT)"
    found = "pgcat._dp_in('{}', {}) IS NOT NULL AND upper(priv_) LIKE '%{}%'"
    can_select = found.format("class", "rel_", "SELECT")
    uses_schema = found.format("namespace", "nsp_", "USAGE")
    connects = found.format("database", "db_", "CONNECT")
    is_analyst = f"pgcat._dp_in('role', role_) = {ANALYST_ROLE_OID}"
    type_label = "(SELECT label FROM pgcat._dp_labels WHERE kind = 'type' AND oid = type_)"
    size_pretty = (
        "CASE WHEN b_ IS NULL THEN NULL WHEN abs(b_) < 10240 THEN b_ || ' bytes' "
        "WHEN abs(b_) < 10485760 THEN round(b_ / 1024) || ' kB' "
        "WHEN abs(b_) < 10737418240 THEN round(b_ / 1048576) || ' MB' "
        "ELSE round(b_ / 1073741824) || ' GB' END")
    macros: dict[str, list[tuple[str, str]]] = {
        "_dp_in": [("kind_, value_", "(SELECT oid FROM pgcat._dp_names WHERE kind = kind_ "
                                     "AND spelling = lower(trim(CAST(value_ AS VARCHAR))))")],
        "_dp_out": [("kind_, oid_", "CASE WHEN oid_ = 0 THEN '-' ELSE coalesce((SELECT label "
                                    "FROM pgcat._dp_labels WHERE kind = kind_ AND oid = oid_), "
                                    "CAST(oid_ AS VARCHAR)) END")],
        "version": [("", _literal(version))],
        "current_schema": [("", "'public'")],
        "current_schemas": [("implicit_", "CASE WHEN implicit_ THEN ['pg_catalog', 'public'] "
                                          "ELSE ['public'] END")],
        "current_database": [("", _literal(identity.database))],
        "current_catalog": [("", _literal(identity.database))],
        "current_user": [("", _literal(identity.user))],
        "session_user": [("", _literal(identity.user))],
        "pg_get_userbyid": [("role_", "coalesce((SELECT label FROM pgcat._dp_labels WHERE "
                                      "kind = 'role' AND oid = role_), 'unknown (OID=' || "
                                      "CAST(role_ AS VARCHAR) || ')')")],
        "pg_encoding_to_char": [("enc_", "CASE enc_ WHEN 6 THEN 'UTF8' WHEN 0 THEN 'SQL_ASCII' "
                                         "ELSE '' END")],
        "format_type": [("type_, typemod_", (
            f"CASE WHEN type_ IS NULL THEN NULL ELSE coalesce({type_label}, '???') || "
            "CASE WHEN type_ IN (1042, 1043) AND typemod_ > 4 THEN "
            "'(' || CAST(typemod_ - 4 AS VARCHAR) || ')' ELSE '' END END"))],
        "regobject_in": [("value_", "CASE WHEN CAST(value_ AS VARCHAR) = '-' "
                                    "THEN CAST(0 AS UINTEGER) END")],
        "regobject_out": [("oid_", "CASE WHEN oid_ = 0 THEN '-' ELSE CAST(oid_ AS VARCHAR) "
                                   "END")],
        "pg_table_is_visible": [("oid_", "oid_ IN (SELECT oid FROM pgcat.pg_class "
                                         "WHERE relnamespace IN (11, 2200))")],
        "has_table_privilege": [("rel_, priv_", can_select),
                                ("user_, rel_, priv_", can_select)],
        "has_any_column_privilege": [("rel_, priv_", can_select),
                                     ("user_, rel_, priv_", can_select)],
        "has_column_privilege": [("rel_, col_, priv_", can_select),
                                 ("user_, rel_, col_, priv_", can_select)],
        "has_schema_privilege": [("nsp_, priv_", uses_schema),
                                 ("user_, nsp_, priv_", uses_schema)],
        "has_database_privilege": [("db_, priv_", connects), ("user_, db_, priv_", connects)],
        "has_function_privilege": [("f_, priv_", "true"), ("user_, f_, priv_", "true")],
        "has_type_privilege": [("t_, priv_", "true"), ("user_, t_, priv_", "true")],
        "has_sequence_privilege": [("s_, priv_", "false"), ("user_, s_, priv_", "false")],
        "pg_has_role": [("role_, priv_", is_analyst), ("user_, role_, priv_", is_analyst)],
        "obj_description": [("o_", null_text), ("o_, catalog_", null_text)],
        "col_description": [("o_, n_", null_text)],
        "shobj_description": [("o_, catalog_", null_text)],
        "pg_get_expr": [("e_, rel_", "CAST(e_ AS VARCHAR)"),
                        ("e_, rel_, pretty_", "CAST(e_ AS VARCHAR)")],
        # sizes never leak
        "pg_relation_size": [("rel_", null_int8), ("rel_, fork_", null_int8)],
        "pg_total_relation_size": [("rel_", null_int8)],
        "pg_table_size": [("rel_", null_int8)],
        "pg_indexes_size": [("rel_", null_int8)],
        "pg_database_size": [("db_", null_int8)],
        "pg_tablespace_size": [("spc_", null_int8)],
        "pg_size_pretty": [("b_", size_pretty)],
        "pg_is_in_recovery": [("", "false")],
        "pg_jit_available": [("", "false")],
        "pg_relation_is_publishable": [("rel_", "false")],
        "pg_is_other_temp_schema": [("nsp_", "false")],
        "pg_my_temp_schema": [("", "CAST(0 AS UINTEGER)")],
        "pg_tablespace_location": [("spc_", "''")],
        "pg_advisory_unlock_all": [("", null_text)],
        # UTC, as a plain timestamp: DuckDB's Python client needs pytz for TIMESTAMPTZ
        "pg_postmaster_start_time": [("", f"CAST({_literal(str(_STARTED))} AS TIMESTAMP)")],
        "inet_server_addr": [("", null_text)], "inet_client_addr": [("", null_text)],
        "inet_server_port": [("", "CAST(NULL AS INTEGER)")],
        "inet_client_port": [("", "CAST(NULL AS INTEGER)")],
        "array_upper": [("a_, dim_", "CASE WHEN len(a_) > 0 AND dim_ = 1 THEN len(a_) END")],
        "array_lower": [("a_, dim_", "CASE WHEN len(a_) > 0 AND dim_ = 1 THEN 1 END")],
        "array_length": [("a_, dim_", "CASE WHEN len(a_) > 0 AND dim_ = 1 THEN len(a_) END")],
        "cardinality": [("a_", "len(a_)")],
        "quote_ident": [("s_", "CASE WHEN regexp_full_match(s_, '[a-z_][a-z0-9_$]*') THEN s_ "
                               "ELSE '\"' || replace(s_, '\"', '\"\"') || '\"' END")],
        "to_regproc": [("value_", "CAST(NULL AS UINTEGER)")],
    }
    for kind in ("class", "type", "namespace", "role"):
        macros[f"reg{kind}_in"] = [("value_", f"pgcat._dp_in('{kind}', value_)")]
        macros[f"to_reg{kind}"] = macros[f"reg{kind}_in"]
        macros[f"reg{kind}_out"] = [("oid_", f"pgcat._dp_out('{kind}', oid_)")]
    for name in ("pg_type_is_visible", "pg_function_is_visible", "pg_collation_is_visible",
                 "pg_opclass_is_visible", "pg_operator_is_visible",
                 "pg_conversion_is_visible"):
        macros[name] = [("o_", "CASE WHEN o_ IS NULL THEN NULL ELSE true END")]
    for name in ("pg_get_constraintdef", "pg_get_viewdef", "pg_get_triggerdef",
                 "pg_get_ruledef"):
        macros[name] = [("o_", null_text), ("o_, pretty_", null_text)]
    macros["pg_get_indexdef"] = [("o_", null_text), ("o_, col_, pretty_", null_text)]
    for name in ("pg_get_functiondef", "pg_get_function_arguments",
                 "pg_get_function_identity_arguments", "pg_get_function_result",
                 "pg_get_partkeydef", "pg_get_partition_constraintdef",
                 "pg_get_statisticsobjdef_columns"):
        macros[name] = [("o_", null_text)]
    macros["pg_get_serial_sequence"] = [("t_, col_", null_text)]
    return macros


_STARTED = dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None)

# Return types of catalog functions (macros, session functions) and of the SQL functions
# catalog queries wrap them in, by PostgreSQL name.
_FUNCTION_TYPES: dict[str, str] = {
    "version": "text", "current_schema": "name", "current_schemas": "_name",
    "current_database": "name", "current_catalog": "name", "current_user": "name",
    "session_user": "name", "pg_get_userbyid": "name", "pg_encoding_to_char": "name",
    "format_type": "text", "pg_table_is_visible": "bool", "obj_description": "text",
    "col_description": "text", "shobj_description": "text", "pg_get_expr": "text",
    "pg_relation_size": "int8", "pg_total_relation_size": "int8", "pg_table_size": "int8",
    "pg_indexes_size": "int8", "pg_database_size": "int8", "pg_tablespace_size": "int8",
    "pg_size_pretty": "text", "pg_is_in_recovery": "bool", "pg_jit_available": "bool",
    "pg_relation_is_publishable": "bool", "pg_is_other_temp_schema": "bool",
    "pg_my_temp_schema": "oid", "pg_tablespace_location": "text",
    "pg_advisory_unlock_all": "void", "pg_postmaster_start_time": "timestamptz",
    "inet_server_addr": "inet", "inet_client_addr": "inet", "inet_server_port": "int4",
    "inet_client_port": "int4", "array_upper": "int4", "array_lower": "int4",
    "array_length": "int4", "cardinality": "int4", "quote_ident": "text",
    "pg_get_serial_sequence": "text", "to_regclass": "regclass", "to_regtype": "regtype",
    "to_regnamespace": "regnamespace", "to_regrole": "regrole", "to_regproc": "regproc",
    "current_setting": "text", "set_config": "text", "pg_backend_pid": "int4",
    "pg_get_indexdef": "text", "has_table_privilege": "bool",
    "has_any_column_privilege": "bool", "has_column_privilege": "bool",
    "has_schema_privilege": "bool", "has_database_privilege": "bool",
    "has_function_privilege": "bool", "has_type_privilege": "bool",
    "has_sequence_privilege": "bool", "pg_has_role": "bool",
    # SQL functions catalog queries use around them
    "array_to_string": "text", "string_agg": "text", "count": "int8",
    "json_build_object": "json", "json_agg": "json", "lower": "text", "upper": "text",
    "concat": "text", "now": "timestamptz",
}
for _name in ("pg_type_is_visible", "pg_function_is_visible", "pg_collation_is_visible",
              "pg_opclass_is_visible", "pg_operator_is_visible", "pg_conversion_is_visible"):
    _FUNCTION_TYPES[_name] = "bool"
for _name in ("pg_get_constraintdef", "pg_get_viewdef", "pg_get_triggerdef", "pg_get_ruledef",
              "pg_get_functiondef", "pg_get_function_arguments",
              "pg_get_function_identity_arguments", "pg_get_function_result",
              "pg_get_partkeydef", "pg_get_partition_constraintdef",
              "pg_get_statisticsobjdef_columns"):
    _FUNCTION_TYPES[_name] = "text"
SESSION_FUNCTIONS = frozenset({"current_setting", "set_config", "pg_backend_pid"})
# Functions only the catalog answers: a statement without relations that calls one of these
# (or casts to a reg* type) goes to the catalog.
_INTERNAL_MACROS = frozenset({"_dp_in", "_dp_out", "regobject_in", "regobject_out"} | {
    f"reg{kind}_{way}" for kind in ("class", "type", "namespace", "role") for way in ("in", "out")})
# Catalog functions a query may call by name (answered by macros).
_MACROS = frozenset(_macros(_Identity("", "", "15.0", ()))) - _INTERNAL_MACROS
# A statement without relations goes to the catalog when it calls one of these (or casts to a
# reg* type); generic array helpers alone do not make a statement a catalog one.
CATALOG_FUNCTIONS = (_MACROS | SESSION_FUNCTIONS) - {
    "array_upper", "array_lower", "array_length", "cardinality", "quote_ident"}
_RENAMED = {"json_build_object": "json_object", "json_agg": "json_group_array"}
_SQL_VALUE_FUNCTIONS = {"user": "current_user", "current_role": "current_user"}
_TYPED_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.CurrentSchema: "current_schema", exp.CurrentSchemas: "current_schemas",
    exp.CurrentVersion: "version", exp.CurrentUser: "current_user",
    exp.SessionUser: "session_user", exp.CurrentDatabase: "current_database",
    exp.CurrentCatalog: "current_catalog",
}


_DATABASES: dict[_Identity, duckdb.DuckDBPyConnection] = {}
_DATABASES_LOCK = threading.Lock()
_MAX_DATABASES = 64


def _connect(identity: _Identity) -> duckdb.DuckDBPyConnection:
    """A connection to the catalog database of an identity, built once per process."""
    with _DATABASES_LOCK:
        con = _DATABASES.get(identity)
        if con is None:
            con = _build_database(identity)
            if len(_DATABASES) >= _MAX_DATABASES:  # cursors keep an evicted one alive
                _DATABASES.pop(next(iter(_DATABASES)))
            _DATABASES[identity] = con
        return con.cursor()


def _build_database(identity: _Identity) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:", config={"enable_external_access": False,
                                             "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False,
                                             "threads": 1, "memory_limit": "256MB"})
    catalog_rows = _catalog_rows(identity)
    rows = {r: catalog_rows[(r.schema, r.name)] for r in CATALOG_RELATIONS
            if catalog_rows[(r.schema, r.name)]} | _lookups(identity)
    statements = [f"CREATE SCHEMA {schema}" for schema in _DUCK_SCHEMAS.values()]
    for relation in (*CATALOG_RELATIONS, _NAMES, _LABELS, _KEYWORDS):
        columns = ", ".join(f'"{c}" {_duck_type_sql(t)}' for c, t in relation.columns)
        statements.append(f"CREATE TABLE {_duck_table(relation)} ({columns})")
    for name, overloads in _macros(identity).items():
        bodies = ", ".join(f"({params}) AS {body}" for params, body in overloads)
        statements.append(f"CREATE MACRO pgcat.{name}{bodies}")
    con.execute(";\n".join(statements))
    for relation, values in rows.items():
        # one list per column, unnested side by side: far faster than row inserts
        unnests = ", ".join(f"unnest(${i}::{_duck_type_sql(t)}[])"
                            for i, (_, t) in enumerate(relation.columns, start=1))
        con.execute(f"INSERT INTO {_duck_table(relation)} SELECT {unnests}",
                    [list(column) for column in zip(*values, strict=True)])
    con.execute("SET lock_configuration = true")
    return con


def _duck_table(relation: Relation) -> str:
    return f'{_DUCK_SCHEMAS[relation.schema]}."{relation.name}"'


# -- statements: routing ----------------------------------------------------------------------


@dataclass
class _Prepared:
    """A catalog statement ready to run: DuckDB tree, output names and types."""

    tree: exp.Expression | None  # None: an unknown catalog shape, answered empty
    columns: tuple[str, ...]
    types: tuple[str | None, ...]
    parameter_types: tuple[str, ...] = ()
    static_sql: str | None = None  # the DuckDB SQL when nothing is bound per call


def _cte_names(node: exp.Expression) -> set[str]:
    names: set[str] = set()
    for ancestor in _ancestors(node):
        with_ = ancestor.args.get("with_") if isinstance(ancestor, exp.Query) else None
        if isinstance(with_, exp.With):
            names |= {cte.alias for cte in with_.expressions}
    return names


def _ancestors(node: exp.Expression) -> Iterable[exp.Expression]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


# `pg_catalog.unnest(…)` parses as Explode, plain `unnest(…)` as Unnest.
_TABLE_FUNCTIONS = (exp.ExplodingGenerateSeries, exp.GenerateSeries, exp.Unnest, exp.Explode)


def _route(tree: exp.Expression) -> list[str] | None:
    """The catalog relations a query reads that the catalog does not model (usually none);
    None when it reads anything else, or reads nothing and calls no catalog function."""
    reads_catalog = False
    unknown: list[str] = []
    for table in tree.find_all(exp.Table):
        schema, name = table.db or None, table.name
        if not isinstance(table.this, exp.Identifier):
            if isinstance(table.this, _TABLE_FUNCTIONS) and schema in (None, "pg_catalog"):
                continue
            return None  # another table function
        if table.catalog:
            return None
        if schema is None and name in _cte_names(table):
            continue
        if schema is None and (("pg_catalog", name) in _CATALOG_BY_NAME
                               or is_statistics_relation(name)):
            schema = "pg_catalog"
        if schema not in _DUCK_SCHEMAS:
            return None
        if is_statistics_relation(name):
            raise UndefinedTable(f'relation "{schema}.{name}" does not exist',
                                 hint="dpproxy shows no statistics: they would reveal "
                                      "sizes and values")
        if (schema, name) not in _CATALOG_BY_NAME:
            unknown.append(f"{schema}.{name}")
        reads_catalog = True
    if not reads_catalog and not _calls_catalog_function(tree):
        return None
    return unknown


def _calls_catalog_function(tree: exp.Expression) -> bool:
    for node in tree.walk():
        if isinstance(node, exp.Cast) and pg_type_name(node.to) in REG_TYPES:
            return True
        if _function_name(node) in CATALOG_FUNCTIONS:
            return True
    return False


def _function_name(node: exp.Expression) -> str | None:
    """The name of a call the catalog answers itself: `pg_catalog.f(…)` (normalized to
    `f(…)`), `version()`, `current_user`, `user`… (None for anything else)."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.Column):
        bare = not node.table and isinstance(node.this, exp.Identifier) and not node.this.quoted
        return _SQL_VALUE_FUNCTIONS.get(node.name) if bare else None
    return _TYPED_FUNCTIONS.get(type(node))


def _sql_function_name(node: exp.Expression) -> str | None:
    """The PostgreSQL name of any function call, built-in ones included (`string_agg`)."""
    name = _function_name(node)
    if name is not None or not isinstance(node, exp.Func) or isinstance(
            node, exp.Cast | exp.Case | exp.Array | exp.Binary | exp.Any | exp.All):
        return name
    head = node.sql("postgres").split("(", 1)[0].strip().lower()
    return head if re.fullmatch(r"[a-z_][a-z0-9_]*", head) else None


# -- statements: normalize PostgreSQL syntax --------------------------------------------------

_OPERATORS: dict[str, Callable[[exp.Expression, exp.Expression], exp.Expression]] = {
    "~": lambda a, b: exp.RegexpLike(this=a, expression=b),
    "!~": lambda a, b: exp.not_(exp.RegexpLike(this=a, expression=b)),
    "~*": lambda a, b: exp.RegexpILike(this=a, expression=b),
    "!~*": lambda a, b: exp.not_(exp.RegexpILike(this=a, expression=b)),
    "~~": lambda a, b: exp.Like(this=a, expression=b),
    "!~~": lambda a, b: exp.not_(exp.Like(this=a, expression=b)),
    "~~*": lambda a, b: exp.ILike(this=a, expression=b),
    "=": lambda a, b: exp.EQ(this=a, expression=b),
    "<>": lambda a, b: exp.NEQ(this=a, expression=b),
    "<": lambda a, b: exp.LT(this=a, expression=b),
    ">": lambda a, b: exp.GT(this=a, expression=b),
    "<=": lambda a, b: exp.LTE(this=a, expression=b),
    ">=": lambda a, b: exp.GTE(this=a, expression=b),
    "||": lambda a, b: exp.DPipe(this=a, expression=b),
}


def _normalize_node(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) \
            and node.this.name.lower() == "pg_catalog" and isinstance(node.expression, exp.Func):
        return node.expression  # pg_catalog.version() → version()
    if isinstance(node, exp.Column) and node.db and node.db.lower() in _DUCK_SCHEMAS:
        node.set("db", None)  # pg_catalog.pg_class.relname → pg_class.relname
        return node
    if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier) \
            and node.db and node.db.lower() == "pg_catalog":
        node.set("db", None)  # pg_catalog.generate_series(…)
        return node
    if isinstance(node, exp.Operator):
        op = str(node.args.get("operator", "")).lower().removeprefix("pg_catalog.").strip()
        make = _OPERATORS.get(op)
        return make(node.this, node.expression) if make else node
    if isinstance(node, exp.Collate):
        return node.this
    if isinstance(node, exp.ByteString):  # E'…': sqlglot has already read the escapes
        return exp.Literal.string(node.name)
    if isinstance(node, exp.Like | exp.ILike) and not isinstance(node.parent, exp.Escape):
        return exp.Escape(this=node, expression=exp.Literal.string("\\"))  # PostgreSQL's default
    return node


def _rewrite_bottom_up(tree: exp.Expression,
                       fn: Callable[[exp.Expression], exp.Expression]) -> exp.Expression:
    """Apply `fn` to every node, children before parents, replacing in place."""
    for node in reversed(list(tree.walk(bfs=False))):
        parent, arg_key, index = node.parent, node.arg_key, node.index
        new = fn(node)  # may adopt `node` into the new subtree: place it where node was
        if new is not node:
            if node is tree:
                tree = new
            elif parent is not None:
                parent.set(arg_key, new, index)
    return tree


def _normalize(tree: exp.Expression) -> exp.Expression:
    return _rewrite_bottom_up(normalize_identifiers(tree, dialect="postgres"), _normalize_node)


# -- statements: PostgreSQL names and types ---------------------------------------------------


def output_name(node: exp.Expression) -> str:
    """The name PostgreSQL gives a select-list item (its FigureColname rules)."""
    name, _ = _figure_name(node)
    return name or "?column?"


def _figure_name(node: exp.Expression) -> tuple[str | None, int]:
    """(name, strength) as PostgreSQL's FigureColnameInternal: 2 strong, 1 weak."""
    if isinstance(node, exp.Alias):
        return node.alias, 2
    if isinstance(node, exp.Paren | exp.Window):
        return _figure_name(node.this)
    if isinstance(node, exp.Column):
        return (None, 0) if isinstance(node.this, exp.Star) else (node.name, 2)
    if isinstance(node, exp.Dot):
        return node.name, 2
    if isinstance(node, exp.Bracket):
        return _figure_name(node.this)
    if isinstance(node, exp.Cast):
        name, strength = _figure_name(node.this)
        if strength <= 1:
            return pg_type_name(node.to).lstrip("_"), 1
        return name, strength
    if isinstance(node, exp.Case):
        default = node.args.get("default")
        name, strength = _figure_name(default) if default is not None else (None, 0)
        return (name, strength) if strength > 1 else ("case", 1)
    if isinstance(node, exp.Exists):
        return "exists", 2
    if isinstance(node, exp.Array):
        return "array", 2
    if isinstance(node, exp.Subquery):
        inner = node.unnest()
        if isinstance(inner, exp.Query) and inner.selects:
            return _figure_name(inner.selects[0])
        return None, 0
    name = _sql_function_name(node)
    return (name, 2) if name else (None, 0)


class _Typer:
    """PostgreSQL types of a query's expressions, resolved through its sources."""

    def __init__(self, relations: Mapping[tuple[str, str], Relation]) -> None:
        self.relations = relations
        self._outputs: dict[int, list[tuple[str, str | None]]] = {}
        self._busy: set[int] = set()

    # sources ----------------------------------------------------------------------------------
    def outputs(self, query: exp.Expression) -> list[tuple[str, str | None]]:
        """(name, type) of each output column of a query."""
        key = id(query)
        if key in self._outputs:
            return self._outputs[key]
        if key in self._busy:
            return []
        self._busy.add(key)
        try:
            result = self._compute_outputs(query)
        finally:
            self._busy.discard(key)
        self._outputs[key] = result
        return result

    def _compute_outputs(self, query: exp.Expression) -> list[tuple[str, str | None]]:
        if isinstance(query, exp.Subquery):
            return self.outputs(query.this)
        if isinstance(query, exp.SetOperation):
            left, right = self.outputs(query.left), self.outputs(query.right)
            merged = []
            for i, (name, type_name) in enumerate(left):
                other = right[i][1] if i < len(right) else None
                merged.append((name, other if type_name in (None, "unknown") and other
                               else type_name))
            return merged
        if not isinstance(query, exp.Select):
            return []
        result: list[tuple[str, str | None]] = []
        for item in query.expressions:
            star = item.this if isinstance(item, exp.Column) else item
            if isinstance(star, exp.Star):
                table = item.table if isinstance(item, exp.Column) else None
                for alias, columns in self._sources(query):
                    if table is None or alias == table:
                        result += columns
                continue
            result.append((output_name(item), self.type_of(item)))
        return result

    def _sources(self, select: exp.Select) -> list[tuple[str, list[tuple[str, str | None]]]]:
        sources = []
        from_ = select.args.get("from_")
        items = [from_.this] if from_ is not None else []
        items += [join.this for join in select.args.get("joins") or []]
        for item in items:
            alias = item.alias_or_name
            columns = self._source_columns(item)
            if columns is not None:
                sources.append((alias, columns))
        return sources

    def _source_columns(self, item: exp.Expression) -> list[tuple[str, str | None]] | None:
        if isinstance(item, exp.Subquery | exp.Lateral):
            columns = self.outputs(item.this)
        elif isinstance(item, exp.Table) and isinstance(item.this, exp.Identifier):
            cte = _find_cte(item) if not item.db else None
            if cte is not None:
                columns = self.outputs(_anchor(cte.this))
                names = [c.name for c in cte.args["alias"].columns] if cte.args.get(
                    "alias") is not None else []
                if names:
                    columns = [(n, columns[i][1] if i < len(columns) else None)
                               for i, n in enumerate(names)]
            else:
                relation = self.relations.get((item.db or "pg_catalog", item.name))
                if relation is None:
                    return None
                columns = [(c, t) for c, t in relation.columns]
        elif isinstance(item, exp.Table):  # a table function: one column named by its alias
            columns = [(item.alias_or_name, self._table_function_type(item.this))]
        else:
            return None
        alias = item.args.get("alias")
        renamed = [c.name for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
        if renamed and (isinstance(item, exp.Subquery | exp.Lateral)
                        or not isinstance(item.this, exp.Identifier)):
            columns = [(n, columns[i][1] if i < len(columns) else None)
                       for i, n in enumerate(renamed)]
        return columns

    def _table_function_type(self, function: exp.Expression) -> str | None:
        """The type of the column a table function yields: unnest's element type, else
        generate_series's int4."""
        if not isinstance(function, exp.Explode):
            return "int4"
        key = id(function)
        if key in self._busy:  # typing its argument looked through the same FROM list
            return None
        self._busy.add(key)
        try:
            return _element_type(self.type_of(function.this))
        finally:
            self._busy.discard(key)

    def column_type(self, column: exp.Column) -> str | None:
        for ancestor in _ancestors(column):
            if not isinstance(ancestor, exp.Select):
                continue
            for alias, columns in self._sources(ancestor):
                if column.table and column.table != alias:
                    continue
                for name, type_name in columns:
                    if name == column.name:
                        return type_name
        return None

    # expressions ------------------------------------------------------------------------------
    def type_of(self, node: exp.Expression) -> str | None:
        """The PostgreSQL type of an expression; None when the tree alone does not say."""
        if isinstance(node, exp.Alias | exp.Paren):
            return self.type_of(node.this)
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                return None
            function = _function_name(node)
            return _FUNCTION_TYPES[function] if function else self.column_type(node)
        if isinstance(node, exp.Cast):
            return pg_type_name(node.to)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return "unknown"
            return "numeric" if any(c in node.this for c in ".eE") else (
                "int4" if abs(int(node.this)) < 2**31 else "int8")
        if isinstance(node, exp.Boolean | exp.Predicate | exp.Connector | exp.Not | exp.Exists
                      | exp.RegexpLike | exp.RegexpILike | exp.Escape):
            return "bool"
        if isinstance(node, exp.Null):
            return "unknown"
        if isinstance(node, exp.Neg):
            return self.type_of(node.this)
        if isinstance(node, exp.Case):
            branches = [i.args.get("true") for i in node.args.get("ifs") or []]
            return self._first_known([*branches, node.args.get("default")])
        if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
            return self._first_known([node.this, *node.expressions])
        if isinstance(node, exp.Nullif):
            return self.type_of(node.this)
        if isinstance(node, exp.Subquery):
            columns = self.outputs(node.this)
            return columns[0][1] if columns else None
        if isinstance(node, exp.Array):
            inner = node.expressions[0] if node.expressions else None
            if isinstance(inner, exp.Query):
                columns = self.outputs(inner)
                element = columns[0][1] if columns else None
            else:
                element = self.type_of(inner) if inner is not None else None
            return _array_type("text" if element == "unknown" else element)
        if isinstance(node, exp.ArrayAgg):
            inner = node.this.this if isinstance(node.this, exp.Order) else node.this
            element = self.type_of(inner)
            return _array_type("text" if element == "unknown" else element)
        if isinstance(node, exp.Bracket):
            return _element_type(self.type_of(node.this))
        if isinstance(node, exp.DPipe):
            return "text"
        if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod):
            return self._first_known([node.this, node.expression])
        if isinstance(node, exp.Min | exp.Max):
            return self.type_of(node.this)
        function = _sql_function_name(node)
        return _FUNCTION_TYPES.get(function) if function else None

    def _first_known(self, nodes: Sequence[exp.Expression | None]) -> str | None:
        seen_unknown = False
        for node in nodes:
            if node is None:
                continue
            type_name = self.type_of(node)
            if type_name == "unknown":
                seen_unknown = True
            elif type_name is not None:
                return type_name
        return "unknown" if seen_unknown else None


def _find_cte(table: exp.Table) -> exp.CTE | None:
    for ancestor in _ancestors(table):
        with_ = ancestor.args.get("with_") if isinstance(ancestor, exp.Query) else None
        if isinstance(with_, exp.With):
            for cte in with_.expressions:
                if cte.alias == table.name:
                    return cte
    return None


def _anchor(query: exp.Expression) -> exp.Expression:
    """A recursive CTE's non-recursive part, which fixes its column types."""
    while isinstance(query, exp.SetOperation):
        query = query.left
    return query


def output_names(sql: str) -> tuple[str, ...]:
    """PostgreSQL's column names for a query's outputs."""
    tree = _normalize(sqlglot.parse_one(sql, read=CatalogPostgres))
    return tuple(name for name, _ in _Typer(_CATALOG_BY_NAME).outputs(tree))


# -- statements: to DuckDB --------------------------------------------------------------------


def _macro_call(name: str, args: Sequence[exp.Expression]) -> exp.Expression:
    return exp.Dot(this=exp.to_identifier("pgcat"),
                   expression=exp.Anonymous(this=name, expressions=list(args)))


def _reg_kind(pg_type: str) -> str:
    return pg_type.removeprefix("reg") if pg_type in (
        "regclass", "regtype", "regnamespace", "regrole") else "object"


def _function_args(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    return [v for v in node.args.values() if isinstance(v, exp.Expression)]


class _ToDuckDB:
    """The tree pass from PostgreSQL's catalog SQL to the catalog database's DuckDB SQL."""

    def __init__(self, typer: _Typer) -> None:
        self.typer = typer
        self.inner_is_text: dict[int, bool] = {}  # reg* casts: from a name, not an oid
        self.array_literals: dict[int, str] = {}  # '{…}' compared with an array: its element

    def prepare(self, tree: exp.Expression) -> None:
        """Record what needs the PostgreSQL tree's types, before the tree is rewritten."""
        for cast in tree.find_all(exp.Cast):
            if pg_type_name(cast.to) in REG_TYPES:
                self.inner_is_text[id(cast)] = isinstance(
                    cast.this, exp.Parameter | exp.Placeholder) or self.typer.type_of(
                    cast.this) in _TEXT_TYPES
        for literal in tree.find_all(exp.Literal):
            comparison = literal.parent
            if literal.is_string and literal.this.startswith("{") \
                    and isinstance(comparison, exp.EQ | exp.NEQ):
                other = comparison.left if comparison.right is literal else comparison.right
                element = _element_type(self.typer.type_of(other))
                if element:
                    self.array_literals[id(literal)] = element

    def __call__(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            return self._table(node)
        if isinstance(node, exp.Cast):
            return self._cast(node)
        name = _function_name(node)
        if name in _MACROS and not isinstance(node, exp.Column | exp.Dot):
            call = _macro_call(name, _function_args(node))
            if name.startswith("to_reg"):
                call.meta["reg"] = "reg" + name.removeprefix("to_reg")
            return call
        if isinstance(node, exp.Column) and name is not None:
            return _macro_call(name, [])
        if isinstance(node, exp.Anonymous) and name in _RENAMED:
            return exp.Anonymous(this=_RENAMED[name], expressions=node.expressions)
        if id(node) in self.array_literals:
            return _pg_array(node.this, self.array_literals[id(node)])
        return node

    def _table(self, table: exp.Table) -> exp.Expression:
        schema = table.db or ("pg_catalog" if ("pg_catalog", table.name) in _CATALOG_BY_NAME
                              and table.name not in _cte_names(table) else None)
        if schema is None:
            return table
        renamed = exp.table_(table.name, db=_DUCK_SCHEMAS[schema], quoted=True)
        alias = table.args.get("alias")
        renamed.set("alias", alias.copy() if alias is not None
                    else exp.TableAlias(this=exp.to_identifier(table.name)))
        # a parenthesized join group, `(pg_class c JOIN pg_namespace n ON …)` as psqlODBC's
        # SQLColumns writes it, hangs its joins on its first table
        renamed.set("joins", table.args.get("joins"))
        return renamed

    def _cast(self, cast: exp.Cast) -> exp.Expression:
        target = pg_type_name(cast.to)
        inner = cast.this
        inner_reg = inner.meta.get("reg")
        if target in REG_TYPES:
            kind = _reg_kind(target)
            if self.inner_is_text.get(id(cast)):
                result = _macro_call(f"reg{kind}_in", [inner])
            else:
                result = exp.cast(inner, "UINTEGER", dialect="duckdb")
            result.meta["reg"] = target
            return result
        if inner_reg and target in _TEXT_TYPES:
            return _macro_call(f"reg{_reg_kind(inner_reg)}_out", [inner])
        if isinstance(inner, exp.Literal) and inner.is_string and inner.this.startswith("{") \
                and _element_type(target):
            return _pg_array(inner.this, _element_type(target))
        return exp.Cast(this=inner, to=_duck_type(target))


def _pg_array(text: str, element: str | None) -> exp.Expression:
    """A PostgreSQL array literal ('{1,2}', '{"a b",NULL}') as a DuckDB list."""
    items: list[Any] = array_items(text.strip(), f"_{element}" if element else "array")
    if element in ("int2", "int4", "int8", "oid", "float4", "float8", "numeric"):
        # not numbers: left as text, DuckDB's cast reports it and the answer is empty
        with contextlib.suppress(ValueError):
            items = [None if v is None else float(v) if "." in v else int(v) for v in items]
    array = exp.Array(expressions=[to_literal(v) for v in items])
    return exp.Cast(this=array, to=_duck_type(f"_{element}")) if element else array


def _wrap_reg_outputs(tree: exp.Expression, types: Sequence[str | None]) -> None:
    """reg* values leave as their names, as PostgreSQL prints them: those cast or looked up
    here, and reg* columns stored as oids."""
    queries = [tree]
    while queries:
        query = queries.pop()
        if isinstance(query, exp.SetOperation):
            queries += [query.left, query.right]
            continue
        if not isinstance(query, exp.Select):
            continue
        positional = not any(isinstance(i, exp.Star) or isinstance(i.this, exp.Star)
                             for i in query.expressions)
        for position, item in enumerate(query.expressions):
            node = item.this if isinstance(item, exp.Alias) else item
            reg = node.meta.get("reg")
            stored = types[position] if positional and position < len(types) else None
            if not reg and stored in REG_TYPES and _duck_type_sql(stored) == "UINTEGER":
                reg = stored
            if reg:  # the output's name is PostgreSQL's, worked out before: no alias needed
                node.replace(_macro_call(f"reg{_reg_kind(reg)}_out", [node.copy()]))


def _parameter_types(tree: exp.Expression, typer: _Typer) -> tuple[str, ...]:
    """A type for each $n: its cast, else the column it is compared with, else text."""
    types: dict[int, str] = {}
    for node in tree.find_all(exp.Parameter):
        try:
            index = int(node.name)
        except ValueError:
            continue
        parent = node.parent
        found: str | None = None
        if isinstance(parent, exp.Cast):
            found = pg_type_name(parent.to)
        elif isinstance(parent, exp.Binary) and not isinstance(parent, exp.DPipe):
            other = parent.right if parent.left is node else parent.left
            found = typer.type_of(other)
        types.setdefault(index, "text" if found in (None, "unknown") else str(found))
    return tuple(types.get(i, "text") for i in range(1, max(types, default=0) + 1))


@functools.lru_cache(maxsize=512)
def _prepare(sql: str) -> _Prepared | None:
    """Parse, route, name, type and translate one catalog query (None: not a catalog one)."""
    try:
        tree = sqlglot.parse_one(sql, read=CatalogPostgres)
    except (ParseError, TokenError, ValueError):
        return None
    if not isinstance(tree, exp.Query):
        return None
    tree = normalize_identifiers(tree, dialect="postgres")  # PG folds unquoted names
    tree = _table_functions(tree)
    unknown = _route(tree)
    if unknown is None:
        return None
    tree = _normalize(tree)
    typer = _Typer(_CATALOG_BY_NAME)
    outputs = typer.outputs(tree)
    columns = tuple(name for name, _ in outputs)
    # unknown literals print as text, as do casts to types the catalog does not know
    types = tuple(None if t is None else t if t in TYPE_OIDS and t != "unknown" else "text"
                  for _, t in outputs)
    parameter_types = _parameter_types(tree, typer)
    if unknown:
        log.warning("catalog: %s not modelled; answering empty", ", ".join(unknown))
        return _Prepared(None, columns, tuple(t or "text" for t in types), parameter_types)
    to_duckdb = _ToDuckDB(typer)
    to_duckdb.prepare(tree)
    tree = _rewrite_bottom_up(tree, to_duckdb)
    _wrap_reg_outputs(tree, types)
    per_call = any(_function_name(n) in SESSION_FUNCTIONS for n in tree.find_all(
        exp.Anonymous)) or any(True for _ in tree.find_all(exp.Parameter, exp.Placeholder))
    static_sql = None if per_call else tree.sql("duckdb")
    return _Prepared(tree, columns, types, parameter_types, static_sql)


def _table_functions(tree: exp.Expression) -> exp.Expression:
    """`FROM pg_get_keywords()` reads the keywords' table, under the call's alias."""
    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous) \
                and node.this.name.lower() == "pg_get_keywords" and not node.this.expressions \
                and (node.db or "pg_catalog").lower() == "pg_catalog":
            alias = node.args.get("alias") or exp.TableAlias(
                this=exp.to_identifier("pg_get_keywords"))
            return exp.Table(this=exp.to_identifier(_KEYWORDS.name),
                             db=exp.to_identifier("pg_catalog"), alias=alias)
        return node
    return tree.transform(swap)


def _bind(tree: exp.Expression, params: Sequence[object] | Mapping[str, object] | None
          ) -> exp.Expression:
    """Parameters as literals; arrays (asyncpg's `$1::oid[]`) as DuckDB lists."""
    if params is None or isinstance(params, Mapping) or not any(
            isinstance(p, list | tuple) or _is_pg_array_for(tree, i, p)
            for i, p in enumerate(params)):
        return bind_parameters(tree, params)
    values = list(params)
    used: set[int] = set()

    def swap(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Parameter):
            return node
        index = int(node.name) - 1
        if not 0 <= index < len(values):
            raise ProgrammingError(f"there is no parameter ${index + 1}")
        used.add(index)
        value = values[index]
        if isinstance(value, str) and _is_pg_array_for(tree, index, value):
            cast = node.parent
            assert isinstance(cast, exp.Cast)
            return _pg_array(value, _duck_element(cast.to))
        if isinstance(value, list | tuple):
            return exp.Array(expressions=[to_literal(v) for v in value])
        return to_literal(value)

    bound = tree.transform(swap, copy=False)
    if len(used) < len(values):
        raise ProgrammingError(f"{len(values)} parameters were given but the query uses "
                               f"{len(used)}")
    return bound


def _duck_element(to: exp.Expression) -> str | None:
    if isinstance(to, exp.DataType) and to.this == exp.DType.ARRAY and to.expressions:
        return _DUCKDB_TYPES.get(to.expressions[0].sql("duckdb").upper())
    return None


def _is_pg_array_for(tree: exp.Expression, index: int, value: object) -> bool:
    if not isinstance(value, str) or not value.startswith("{"):
        return False
    return any(isinstance(n.parent, exp.Cast) and _duck_element(n.parent.to) is not None
               for n in tree.find_all(exp.Parameter) if n.name == str(index + 1))


# Words without which a statement cannot be a catalog one: a cheap look at the tokens spares
# parsing every DP query twice.
_CATALOG_WORDS = frozenset(
    {"pg_catalog", "information_schema", *REG_TYPES, *CATALOG_FUNCTIONS, *_SQL_VALUE_FUNCTIONS,
     "current_schema", "current_schemas", "current_user", "session_user", "current_catalog",
     "pg_get_keywords", *(r.name for r in CATALOG_RELATIONS if r.schema == "pg_catalog")})


@functools.lru_cache(maxsize=1024)
def _classify(sql: str) -> tuple[str, str] | None:
    """("show", setting name) or ("query", text) for a single statement that may be a
    catalog one; None for anything else."""
    try:
        pieces = split_statements(sql)
    except Error:
        return None
    if len(pieces) != 1:
        return None
    text, tokens = pieces[0][0], pieces[0][1]
    first = tokens[0].text.upper()
    if first == "SHOW":
        try:
            name = parse_statements(text)[0].name or ""
        except Error:
            return None
        return "show", _SHOW_ALIASES.get(name, name)
    words = {t.text.lower() for t in tokens}
    if first not in ("SELECT", "WITH", "(", "VALUES") or not (
            words & _CATALOG_WORDS or any(w.startswith("pg_stat") for w in words)):
        return None
    return "query", text


# -- the catalog ------------------------------------------------------------------------------


class Catalog:
    """One connection's view of pg_catalog and information_schema, from the policy."""

    def __init__(self, policy: Policy, analyst: AnalystPolicy, *, database: str, user: str,
                 server_version: str = "15.0", settings: MutableMapping[str, str] | None = None,
                 backend_pid: int = 0) -> None:
        """`settings`: the connection's client settings (SET by the client, lower-case
        names), read by SHOW and current_setting() and written by set_config();
        `backend_pid`: what pg_backend_pid() returns (the BackendKeyData process id)."""
        self.identity = _Identity(database, user, server_version,
                                  _granted_tables(policy, analyst))
        self.settings: MutableMapping[str, str] = settings if settings is not None else {}
        self.backend_pid = backend_pid
        self._defaults = {k.lower(): (k, v) for k, v in _settings(self.identity).items()}
        self._cursor = _connect(self.identity)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._cursor.close()

    def interrupt(self) -> None:
        """Cancel the catalog query running on this connection, if any."""
        self._cursor.interrupt()

    # public interface -------------------------------------------------------------------------
    def answer(self, sql: str, params: Sequence[object] | None = None) -> Result | None:
        """Answer a catalog statement, or None when it is not one (the caller then sends it
        to the DP session)."""
        statement = self._statement(sql)
        if statement is None:
            return None
        if isinstance(statement, str):
            return self._show(statement)
        return self._run(statement, params, sql)

    def describe(self, sql: str) -> Description | None:
        """The columns and types `answer` would return, parameters unknown (NULL)."""
        statement = self._statement(sql)
        if statement is None:
            return None
        if isinstance(statement, str):
            canonical, _ = self._setting(statement)
            return Description((canonical,), ("text",))
        nulls = [None] * len(statement.parameter_types)
        result = self._run(statement, nulls, sql, record=False)
        return Description(result.columns, result.types)

    def parameter_types(self, sql: str) -> tuple[str, ...] | None:
        """PostgreSQL type names of a catalog statement's $1…$n (None: not a catalog one)."""
        statement = self._statement(sql)
        if statement is None:
            return None
        return () if isinstance(statement, str) else statement.parameter_types

    # statements -------------------------------------------------------------------------------
    def _statement(self, sql: str) -> _Prepared | str | None:
        """A prepared catalog query, a SHOW's setting name, or None."""
        classified = _classify(sql)
        if classified is None:
            return None
        kind, text = classified
        if kind == "show":
            return text if text.lower() in self._defaults else None
        return _prepare(text)

    def _setting(self, name: str) -> tuple[str, str | None]:
        canonical, default = self._defaults.get(name.lower(), (name, None))
        return canonical, self.settings.get(name.lower(), default)

    def _show(self, name: str) -> Result:
        canonical, value = self._setting(name)
        return Result((canonical,), [(value,)], "SHOW", ("text",))

    def _run(self, statement: _Prepared, params: Sequence[object] | None, sql: str,
             record: bool = True) -> Result:
        if statement.tree is None:
            return self._empty(statement)
        duck_sql = statement.static_sql
        if duck_sql is None:
            tree = _bind(statement.tree.copy(), params)
            tree = _rewrite_bottom_up(tree, lambda n: self._session_function(n, record))
            duck_sql = tree.sql("duckdb")
        elif params:
            raise ProgrammingError(f"the query has no placeholders but {len(params)} "
                                   "parameters were given")
        try:
            job = current_job()
            with self._lock:
                # a statement stopped while it was parsed would otherwise run whole: an
                # interrupt reaches only a query DuckDB has started (the connection goes on
                # interrupting until the statement is done, for the moment in between)
                if job is not None and job.cancelled:
                    raise QueryCanceled(job.reason, detail="nothing was charged")
                cursor = self._cursor.execute(duck_sql)
                description = cursor.description or []
                rows = _bounded_rows(cursor)
        except duckdb.InterruptException:
            raise QueryCanceled("canceling statement due to user request") from None
        except duckdb.Error as exc:
            log.warning("catalog: cannot answer %r: %s", sql[:200], str(exc).splitlines()[0])
            return self._empty(statement)
        if len(description) == len(statement.columns):
            columns = statement.columns
            types = tuple(t or _DUCKDB_TYPES.get(str(d[1]), "text")
                          for t, d in zip(statement.types, description, strict=True))
        else:  # a star the tree could not expand: DuckDB's names and types
            columns = tuple(d[0] for d in description)
            types = tuple(_duck_result_type(str(d[1])) for d in description)
        return Result(columns, rows, f"SELECT {len(rows)}", types)

    @staticmethod
    def _empty(statement: _Prepared) -> Result:
        return Result(statement.columns, [], "SELECT 0",
                      tuple(t or "text" for t in statement.types))

    def _session_function(self, node: exp.Expression, record: bool) -> exp.Expression:
        if not isinstance(node, exp.Anonymous) or node.name.lower() not in SESSION_FUNCTIONS:
            return node
        name = node.name.lower()
        if name == "pg_backend_pid":
            return exp.cast(exp.Literal.number(self.backend_pid), "INTEGER")
        values: list[Any] = []
        for arg in map(_uncast, node.expressions):
            if not isinstance(arg, exp.Literal | exp.Null | exp.Boolean):
                return exp.cast(exp.Null(), "VARCHAR")  # a setting named by the data: none
            values.append(None if isinstance(arg, exp.Null) else arg.this)
        if not values:
            return node
        if values[0] is None:  # strict, as in PostgreSQL; also what Describe's NULLs get
            return exp.cast(exp.Null(), "VARCHAR")
        setting = str(values[0])
        if name == "set_config":
            if setting.lower().startswith("dpproxy."):
                # the catalog keeps client settings only: the session's options would be
                # reported set while queries ran at the old ones
                raise NotSupportedError(f"set_config cannot change {setting}",
                                        hint=f"SET {setting} = …")
            value = None if len(values) < 2 or values[1] is None else str(values[1])
            if record and value is not None:
                self.settings[setting.lower()] = value
            return exp.cast(to_literal(value), "VARCHAR")
        _, current = self._setting(setting)
        if current is None:
            missing_ok = len(values) > 1 and values[1] in (True, "true")
            if not missing_ok:
                raise UndefinedObject(f'unrecognized configuration parameter "{setting}"',
                                      hint="dpproxy's own options: SHOW dpproxy.epsilon …")
        return exp.cast(to_literal(current), "VARCHAR")


# The most a catalog answer may hold, in bytes of its values: the catalog is small, but a
# query of it is not (repeat('x', 5000) over a cross join held 450 MB per connection).
MAX_CATALOG_BYTES = 64 * 2 ** 20


def _bounded_rows(cursor: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    size = 0
    while chunk := cursor.fetchmany(2048):
        size += sum(_size(v) for row in chunk for v in row)
        if size > MAX_CATALOG_BYTES:
            raise ProgramLimitExceeded(
                f"the catalog query's answer is larger than {MAX_CATALOG_BYTES // 2 ** 20} MB",
                hint="select fewer rows or columns")
        rows.extend(chunk)
    return rows


def _size(value: object) -> int:
    """About the bytes a value holds, its items counted too (array_agg of long texts)."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple):
        return 8 + sum(_size(v) for v in value)
    if isinstance(value, dict):
        return 8 + sum(_size(k) + _size(v) for k, v in value.items())
    return 8


def _uncast(node: exp.Expression) -> exp.Expression:
    """What a cast wraps: psycopg's `current_setting($1::VARCHAR)` binds a cast literal."""
    while isinstance(node, exp.Cast):
        node = node.this
    return node


def _duck_result_type(duck: str) -> str:
    if duck.endswith("[]"):
        return _array_type(_duck_result_type(duck[:-2])) or "text"
    return _DUCKDB_TYPES.get(duck, "text")
