"""The catalog clients query: answered from the policy, never from the data.

The reference statements below are what psql, psycopg, asyncpg, SQLAlchemy and
pandas sent to a real PostgreSQL 15 (../shared/pgwire-transcripts), with the column names
and type oids PostgreSQL's RowDescription gave them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from dpproxy import errors
from dpproxy.errors import UndefinedTable
from dpproxy.policy import Policy, load_policy
from dpproxy.server.catalog import TYPE_OIDS, Catalog
from dpproxy.server.jobs import QueryCanceled

# -- reference statements ----------------------------------------------------------------
# (client, SQL, parameters as the server decodes them, RowDescription as name:type oid)

CATALOG_QUERIES: list[tuple[str, str, list[Any] | None, list[str]]] = [
    ('asyncpg',
     (
        '\n'
        '                    SELECT\n'
        "                        current_setting('jit') AS cur,\n"
        "                        set_config('jit', 'off', false) AS new\n"
        '                    '),
     None,
     ['cur:25', 'new:25']),
    ('asyncpg',
     (
        'WITH RECURSIVE typeinfo_tree(\n'
        '    oid, ns, name, kind, basetype, elemtype, elemdelim,\n'
        '    range_subtype, attrtypoids, attrnames, depth)\n'
        'AS (\n'
        '    SELECT\n'
        '        ti.oid, ti.ns, ti.name, ti.kind, ti.basetype,\n'
        '        ti.elemtype, ti.elemdelim, ti.range_subtype,\n'
        '        ti.attrtypoids, ti.attrnames, 0\n'
        '    FROM\n'
        '            (\n'
        '        SELECT\n'
        '            t.oid                           AS oid,\n'
        '            ns.nspname                      AS ns,\n'
        '            t.typname                       AS name,\n'
        '            t.typtype                       AS kind,\n'
        "            (CASE WHEN t.typtype = 'd' THEN\n"
        '                (WITH RECURSIVE typebases(oid, depth) AS (\n'
        '                    SELECT\n'
        '                        t2.typbasetype      AS oid,\n'
        '                        0                   AS depth\n'
        '                    FROM\n'
        '                        pg_type t2\n'
        '                    WHERE\n'
        '                        t2.oid = t.oid\n'
        '\n'
        '                    UNION ALL\n'
        '\n'
        '                    SELECT\n'
        '                        t2.typbasetype      AS oid,\n'
        '                        tb.depth + 1        AS depth\n'
        '                    FROM\n'
        '                        pg_type t2,\n'
        '                        typebases tb\n'
        '                    WHERE\n'
        '                       tb.oid = t2.oid\n'
        '                       AND t2.typbasetype != 0\n'
        '               ) SELECT oid FROM typebases ORDER BY depth DESC LIMIT '
        '1)\n'
        '\n'
        '               ELSE NULL\n'
        '            END)                            AS basetype,\n'
        '            t.typelem                       AS elemtype,\n'
        '            elem_t.typdelim                 AS elemdelim,\n'
        '            COALESCE(\n'
        '                range_t.rngsubtype,\n'
        '                multirange_t.rngsubtype)    AS range_subtype,\n'
        "            (CASE WHEN t.typtype = 'c' THEN\n"
        '                (SELECT\n'
        '                    array_agg(ia.atttypid ORDER BY ia.attnum)\n'
        '                FROM\n'
        '                    pg_attribute ia\n'
        '                    INNER JOIN pg_class c\n'
        '                        ON (ia.attrelid = c.oid)\n'
        '                WHERE\n'
        '                    ia.attnum > 0 AND NOT ia.attisdropped\n'
        '                    AND c.reltype = t.oid)\n'
        '\n'
        '                ELSE NULL\n'
        '            END)                            AS attrtypoids,\n'
        "            (CASE WHEN t.typtype = 'c' THEN\n"
        '                (SELECT\n'
        '                    array_agg(ia.attname::text ORDER BY ia.attnum)\n'
        '                FROM\n'
        '                    pg_attribute ia\n'
        '                    INNER JOIN pg_class c\n'
        '                        ON (ia.attrelid = c.oid)\n'
        '                WHERE\n'
        '                    ia.attnum > 0 AND NOT ia.attisdropped\n'
        '                    AND c.reltype = t.oid)\n'
        '\n'
        '                ELSE NULL\n'
        '            END)                            AS attrnames\n'
        '        FROM\n'
        '            pg_catalog.pg_type AS t\n'
        '            INNER JOIN pg_catalog.pg_namespace ns ON (\n'
        '                ns.oid = t.typnamespace)\n'
        '            LEFT JOIN pg_type elem_t ON (\n'
        '                t.typlen = -1 AND\n'
        '                t.typelem != 0 AND\n'
        '                t.typelem = elem_t.oid\n'
        '            )\n'
        '            LEFT JOIN pg_range range_t ON (\n'
        '                t.oid = range_t.rngtypid\n'
        '            )\n'
        '            LEFT JOIN pg_range multirange_t ON (\n'
        '                t.oid = multirange_t.rngmultitypid\n'
        '            )\n'
        '    )\n'
        ' AS ti\n'
        '    WHERE\n'
        '        ti.oid = any($1::oid[])\n'
        '\n'
        '    UNION ALL\n'
        '\n'
        '    SELECT\n'
        '        ti.oid, ti.ns, ti.name, ti.kind, ti.basetype,\n'
        '        ti.elemtype, ti.elemdelim, ti.range_subtype,\n'
        '        ti.attrtypoids, ti.attrnames, tt.depth + 1\n'
        '    FROM\n'
        '            (\n'
        '        SELECT\n'
        '            t.oid                           AS oid,\n'
        '            ns.nspname                      AS ns,\n'
        '            t.typname                       AS name,\n'
        '            t.typtype                       AS kind,\n'
        "            (CASE WHEN t.typtype = 'd' THEN\n"
        '                (WITH RECURSIVE typebases(oid, depth) AS (\n'
        '                    SELECT\n'
        '                        t2.typbasetype      AS oid,\n'
        '                        0                   AS depth\n'
        '                    FROM\n'
        '                        pg_type t2\n'
        '                    WHERE\n'
        '                        t2.oid = t.oid\n'
        '\n'
        '                    UNION ALL\n'
        '\n'
        '                    SELECT\n'
        '                        t2.typbasetype      AS oid,\n'
        '                        tb.depth + 1        AS depth\n'
        '                    FROM\n'
        '                        pg_type t2,\n'
        '                        typebases tb\n'
        '                    WHERE\n'
        '                       tb.oid = t2.oid\n'
        '                       AND t2.typbasetype != 0\n'
        '               ) SELECT oid FROM typebases ORDER BY depth DESC LIMIT '
        '1)\n'
        '\n'
        '               ELSE NULL\n'
        '            END)                            AS basetype,\n'
        '            t.typelem                       AS elemtype,\n'
        '            elem_t.typdelim                 AS elemdelim,\n'
        '            COALESCE(\n'
        '                range_t.rngsubtype,\n'
        '                multirange_t.rngsubtype)    AS range_subtype,\n'
        "            (CASE WHEN t.typtype = 'c' THEN\n"
        '                (SELECT\n'
        '                    array_agg(ia.atttypid ORDER BY ia.attnum)\n'
        '                FROM\n'
        '                    pg_attribute ia\n'
        '                    INNER JOIN pg_class c\n'
        '                        ON (ia.attrelid = c.oid)\n'
        '                WHERE\n'
        '                    ia.attnum > 0 AND NOT ia.attisdropped\n'
        '                    AND c.reltype = t.oid)\n'
        '\n'
        '                ELSE NULL\n'
        '            END)                            AS attrtypoids,\n'
        "            (CASE WHEN t.typtype = 'c' THEN\n"
        '                (SELECT\n'
        '                    array_agg(ia.attname::text ORDER BY ia.attnum)\n'
        '                FROM\n'
        '                    pg_attribute ia\n'
        '                    INNER JOIN pg_class c\n'
        '                        ON (ia.attrelid = c.oid)\n'
        '                WHERE\n'
        '                    ia.attnum > 0 AND NOT ia.attisdropped\n'
        '                    AND c.reltype = t.oid)\n'
        '\n'
        '                ELSE NULL\n'
        '            END)                            AS attrnames\n'
        '        FROM\n'
        '            pg_catalog.pg_type AS t\n'
        '            INNER JOIN pg_catalog.pg_namespace ns ON (\n'
        '                ns.oid = t.typnamespace)\n'
        '            LEFT JOIN pg_type elem_t ON (\n'
        '                t.typlen = -1 AND\n'
        '                t.typelem != 0 AND\n'
        '                t.typelem = elem_t.oid\n'
        '            )\n'
        '            LEFT JOIN pg_range range_t ON (\n'
        '                t.oid = range_t.rngtypid\n'
        '            )\n'
        '            LEFT JOIN pg_range multirange_t ON (\n'
        '                t.oid = multirange_t.rngmultitypid\n'
        '            )\n'
        '    )\n'
        ' ti,\n'
        '        typeinfo_tree tt\n'
        '    WHERE\n'
        '        (tt.elemtype IS NOT NULL AND ti.oid = tt.elemtype)\n'
        '        OR (tt.attrtypoids IS NOT NULL AND ti.oid = '
        'any(tt.attrtypoids))\n'
        '        OR (tt.range_subtype IS NOT NULL AND ti.oid = '
        'tt.range_subtype)\n'
        '        OR (tt.basetype IS NOT NULL AND ti.oid = tt.basetype)\n'
        ')\n'
        '\n'
        'SELECT DISTINCT\n'
        '    *,\n'
        '    basetype::regtype::text AS basetype_name,\n'
        '    elemtype::regtype::text AS elemtype_name,\n'
        '    range_subtype::regtype::text AS range_subtype_name\n'
        'FROM\n'
        '    typeinfo_tree\n'
        'ORDER BY\n'
        '    depth DESC\n'),
     [[16387]],
     ['oid:26', 'ns:19', 'name:19', 'kind:18', 'basetype:26', 'elemtype:26', 'elemdelim:18',
      'range_subtype:26', 'attrtypoids:1028', 'attrnames:1009', 'depth:23',
      'basetype_name:25', 'elemtype_name:25', 'range_subtype_name:25']),
    ('asyncpg',
     (
        '\n'
        '                SELECT\n'
        "                    set_config('jit', $1, false)\n"
        '                '),
     ['on'],
     ['set_config:25']),
    ('pandas_sqlalchemy',
     'select pg_catalog.version()',
     None,
     ['version:25']),
    ('pandas_sqlalchemy',
     'select current_schema()',
     None,
     ['current_schema:19']),
    ('pandas_sqlalchemy',
     'show transaction isolation level',
     None,
     ['transaction_isolation:25']),
    ('pandas_sqlalchemy',
     'show standard_conforming_strings',
     None,
     ['standard_conforming_strings:25']),
    ('pandas_sqlalchemy',
     (
        'SELECT\n'
        '    typname AS name, oid, typarray AS array_oid,\n'
        '    oid::regtype::text AS regtype, typdelim AS delimiter\n'
        'FROM pg_type t\n'
        'WHERE t.oid = to_regtype($1)\n'
        'ORDER BY t.oid\n'),
     ['hstore'],
     ['name:19', 'oid:26', 'array_oid:26', 'regtype:25', 'delimiter:18']),
    ('pandas_sqlalchemy',
     (
        'SELECT pg_catalog.pg_class.relname \n'
        'FROM pg_catalog.pg_class JOIN pg_catalog.pg_namespace ON '
        'pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace \n'
        'WHERE pg_catalog.pg_class.relname IN ($1::VARCHAR) AND '
        'pg_catalog.pg_class.relkind = ANY (ARRAY[$2::VARCHAR, $3::VARCHAR, '
        '$4::VARCHAR, $5::VARCHAR, $6::VARCHAR]) AND '
        'pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND '
        'pg_catalog.pg_namespace.nspname != $7::VARCHAR'),
     ['SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation ORDER BY occupation',
      'r', 'p', 'f', 'v', 'm', 'pg_catalog'],
     ['relname:19']),
    ('psql_d',
     (
        'SELECT n.nspname as "Schema",\n'
        '  c.relname as "Name",\n'
        "  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' "
        "THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN "
        "'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' "
        "WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' "
        'END as "Type",\n'
        '  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"\n'
        'FROM pg_catalog.pg_class c\n'
        '     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\n'
        '     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam\n'
        "WHERE c.relkind IN ('r','p','v','m','S','f','')\n"
        "      AND n.nspname <> 'pg_catalog'\n"
        "      AND n.nspname !~ '^pg_toast'\n"
        "      AND n.nspname <> 'information_schema'\n"
        '  AND pg_catalog.pg_table_is_visible(c.oid)\n'
        'ORDER BY 1,2;'),
     None,
     ['Schema:19', 'Name:19', 'Type:25', 'Owner:19']),
    ('psql_d_table',
     (
        'SELECT c.oid,\n'
        '  n.nspname,\n'
        '  c.relname\n'
        'FROM pg_catalog.pg_class c\n'
        '     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\n'
        "WHERE c.relname OPERATOR(pg_catalog.~) '^(adult)$' COLLATE "
        'pg_catalog.default\n'
        '  AND pg_catalog.pg_table_is_visible(c.oid)\n'
        'ORDER BY 2, 3;'),
     None,
     ['oid:26', 'nspname:19', 'relname:19']),
    ('psql_d_table',
     (
        'SELECT c.relchecks, c.relkind, c.relhasindex, c.relhasrules, '
        'c.relhastriggers, c.relrowsecurity, c.relforcerowsecurity, false AS '
        "relhasoids, c.relispartition, '', c.reltablespace, CASE WHEN "
        "c.reloftype = 0 THEN '' ELSE "
        'c.reloftype::pg_catalog.regtype::pg_catalog.text END, '
        'c.relpersistence, c.relreplident, am.amname\n'
        'FROM pg_catalog.pg_class c\n'
        ' LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid)\n'
        'LEFT JOIN pg_catalog.pg_am am ON (c.relam = am.oid)\n'
        "WHERE c.oid = '16391';"),
     None,
     ['relchecks:21', 'relkind:18', 'relhasindex:16', 'relhasrules:16', 'relhastriggers:16',
      'relrowsecurity:16', 'relforcerowsecurity:16', 'relhasoids:16',
      'relispartition:16', '?column?:25', 'reltablespace:26', 'reloftype:25',
      'relpersistence:18', 'relreplident:18', 'amname:19']),
    ('psql_d_table',
     (
        'SELECT a.attname,\n'
        '  pg_catalog.format_type(a.atttypid, a.atttypmod),\n'
        '  (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true)\n'
        '   FROM pg_catalog.pg_attrdef d\n'
        '   WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND '
        'a.atthasdef),\n'
        '  a.attnotnull,\n'
        '  (SELECT c.collname FROM pg_catalog.pg_collation c, '
        'pg_catalog.pg_type t\n'
        '   WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND '
        'a.attcollation <> t.typcollation) AS attcollation,\n'
        '  a.attidentity,\n'
        '  a.attgenerated\n'
        'FROM pg_catalog.pg_attribute a\n'
        "WHERE a.attrelid = '16391' AND a.attnum > 0 AND NOT a.attisdropped\n"
        'ORDER BY a.attnum;'),
     None,
     ['attname:19', 'format_type:25', 'pg_get_expr:25', 'attnotnull:16', 'attcollation:19',
      'attidentity:18', 'attgenerated:18']),
    ('psql_d_table',
     (
        'SELECT pol.polname, pol.polpermissive,\n'
        "  CASE WHEN pol.polroles = '{0}' THEN NULL ELSE "
        'pg_catalog.array_to_string(array(select rolname from '
        "pg_catalog.pg_roles where oid = any (pol.polroles) order by 1),',') "
        'END,\n'
        '  pg_catalog.pg_get_expr(pol.polqual, pol.polrelid),\n'
        '  pg_catalog.pg_get_expr(pol.polwithcheck, pol.polrelid),\n'
        '  CASE pol.polcmd\n'
        "    WHEN 'r' THEN 'SELECT'\n"
        "    WHEN 'a' THEN 'INSERT'\n"
        "    WHEN 'w' THEN 'UPDATE'\n"
        "    WHEN 'd' THEN 'DELETE'\n"
        '    END AS cmd\n'
        'FROM pg_catalog.pg_policy pol\n'
        "WHERE pol.polrelid = '16391' ORDER BY 1;"),
     None,
     ['polname:19', 'polpermissive:16', 'array_to_string:25', 'pg_get_expr:25',
      'pg_get_expr:25', 'cmd:25']),
    ('psql_d_table',
     (
        'SELECT oid, stxrelid::pg_catalog.regclass, '
        'stxnamespace::pg_catalog.regnamespace::pg_catalog.text AS nsp, '
        'stxname,\n'
        'pg_catalog.pg_get_statisticsobjdef_columns(oid) AS columns,\n'
        "  'd' = any(stxkind) AS ndist_enabled,\n"
        "  'f' = any(stxkind) AS deps_enabled,\n"
        "  'm' = any(stxkind) AS mcv_enabled,\n"
        'stxstattarget\n'
        'FROM pg_catalog.pg_statistic_ext\n'
        "WHERE stxrelid = '16391'\n"
        'ORDER BY nsp, stxname;'),
     None,
     ['oid:26', 'stxrelid:2205', 'nsp:25', 'stxname:19', 'columns:25', 'ndist_enabled:16',
      'deps_enabled:16', 'mcv_enabled:16', 'stxstattarget:23']),
    ('psql_d_table',
     (
        'SELECT pubname\n'
        '     , NULL\n'
        '     , NULL\n'
        'FROM pg_catalog.pg_publication p\n'
        '     JOIN pg_catalog.pg_publication_namespace pn ON p.oid = '
        'pn.pnpubid\n'
        '     JOIN pg_catalog.pg_class pc ON pc.relnamespace = pn.pnnspid\n'
        "WHERE pc.oid ='16391' and "
        "pg_catalog.pg_relation_is_publishable('16391')\n"
        'UNION\n'
        'SELECT pubname\n'
        '     , pg_get_expr(pr.prqual, c.oid)\n'
        '     , (CASE WHEN pr.prattrs IS NOT NULL THEN\n'
        "         (SELECT string_agg(attname, ', ')\n"
        '           FROM pg_catalog.generate_series(0, '
        'pg_catalog.array_upper(pr.prattrs::pg_catalog.int2[], 1)) s,\n'
        '                pg_catalog.pg_attribute\n'
        '          WHERE attrelid = pr.prrelid AND attnum = prattrs[s])\n'
        '        ELSE NULL END) FROM pg_catalog.pg_publication p\n'
        '     JOIN pg_catalog.pg_publication_rel pr ON p.oid = pr.prpubid\n'
        '     JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid\n'
        "WHERE pr.prrelid = '16391'\n"
        'UNION\n'
        'SELECT pubname\n'
        '     , NULL\n'
        '     , NULL\n'
        'FROM pg_catalog.pg_publication p\n'
        'WHERE p.puballtables AND '
        "pg_catalog.pg_relation_is_publishable('16391')\n"
        'ORDER BY 1;'),
     None,
     ['pubname:19', '?column?:25', '?column?:25']),
    ('psql_d_table',
     (
        'SELECT c.oid::pg_catalog.regclass\n'
        'FROM pg_catalog.pg_class c, pg_catalog.pg_inherits i\n'
        "WHERE c.oid = i.inhparent AND i.inhrelid = '16391'\n"
        "  AND c.relkind != 'p' AND c.relkind != 'I'\n"
        'ORDER BY inhseqno;'),
     None,
     ['oid:2205']),
    ('psql_d_table',
     (
        'SELECT c.oid::pg_catalog.regclass, c.relkind, inhdetachpending, '
        'pg_catalog.pg_get_expr(c.relpartbound, c.oid)\n'
        'FROM pg_catalog.pg_class c, pg_catalog.pg_inherits i\n'
        "WHERE c.oid = i.inhrelid AND i.inhparent = '16391'\n"
        "ORDER BY pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', "
        'c.oid::pg_catalog.regclass::pg_catalog.text;'),
     None,
     ['oid:2205', 'relkind:18', 'inhdetachpending:16', 'pg_get_expr:25']),
    ('psql_dn',
     (
        'SELECT n.nspname AS "Name",\n'
        '  pg_catalog.pg_get_userbyid(n.nspowner) AS "Owner"\n'
        'FROM pg_catalog.pg_namespace n\n'
        "WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'\n"
        'ORDER BY 1;'),
     None,
     ['Name:19', 'Owner:19']),
    ('psql_dt',
     (
        'SELECT n.nspname as "Schema",\n'
        '  c.relname as "Name",\n'
        "  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' "
        "THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN "
        "'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' "
        "WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' "
        'END as "Type",\n'
        '  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"\n'
        'FROM pg_catalog.pg_class c\n'
        '     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\n'
        '     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam\n'
        "WHERE c.relkind IN ('r','p','')\n"
        "      AND n.nspname <> 'pg_catalog'\n"
        "      AND n.nspname !~ '^pg_toast'\n"
        "      AND n.nspname <> 'information_schema'\n"
        '  AND pg_catalog.pg_table_is_visible(c.oid)\n'
        'ORDER BY 1,2;'),
     None,
     ['Schema:19', 'Name:19', 'Type:25', 'Owner:19']),
    ('psql_interactive',
     (
        'SELECT c.relname, NULL::pg_catalog.text FROM pg_catalog.pg_class c '
        "WHERE c.relkind IN ('r', 'S', 'v', 'm', 'f', 'p') AND (c.relname) "
        "LIKE 'ad%' AND pg_catalog.pg_table_is_visible(c.oid) AND "
        'c.relnamespace <> (SELECT oid FROM pg_catalog.pg_namespace WHERE '
        "nspname = 'pg_catalog')\n"
        'UNION ALL\n'
        'SELECT NULL::pg_catalog.text, n.nspname FROM pg_catalog.pg_namespace '
        "n WHERE n.nspname LIKE 'ad%' AND n.nspname NOT LIKE E'pg\\\\_%'\n"
        'LIMIT 1000'),
     None,
     ['relname:19', 'text:25']),
    ('psql_l',
     (
        'SELECT d.datname as "Name",\n'
        '       pg_catalog.pg_get_userbyid(d.datdba) as "Owner",\n'
        '       pg_catalog.pg_encoding_to_char(d.encoding) as "Encoding",\n'
        '       d.datcollate as "Collate",\n'
        '       d.datctype as "Ctype",\n'
        '       d.daticulocale as "ICU Locale",\n'
        "       CASE d.datlocprovider WHEN 'c' THEN 'libc' WHEN 'i' THEN 'icu' "
        'END AS "Locale Provider",\n'
        '       pg_catalog.array_to_string(d.datacl, E\'\\n\') AS "Access '
        'privileges"\n'
        'FROM pg_catalog.pg_database d\n'
        'ORDER BY 1;'),
     None,
     ['Name:19', 'Owner:19', 'Encoding:19', 'Collate:25', 'Ctype:25', 'ICU Locale:25',
      'Locale Provider:25', 'Access privileges:25']),
    ('sqlalchemy_psycopg',
     (
        'SELECT pg_catalog.pg_namespace.nspname \n'
        'FROM pg_catalog.pg_namespace \n'
        "WHERE (pg_catalog.pg_namespace.nspname NOT LIKE $1::VARCHAR || '%' "
        "ESCAPE '/') ORDER BY pg_catalog.pg_namespace.nspname"),
     ['pg/_'],
     ['nspname:19']),
    ('sqlalchemy_psycopg',
     (
        'SELECT pg_catalog.pg_class.relname \n'
        'FROM pg_catalog.pg_class JOIN pg_catalog.pg_namespace ON '
        'pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace \n'
        'WHERE pg_catalog.pg_class.relkind = ANY (ARRAY[$1::VARCHAR, '
        '$2::VARCHAR]) AND pg_catalog.pg_class.relpersistence != $3::VARCHAR '
        'AND pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND '
        'pg_catalog.pg_namespace.nspname != $4::VARCHAR'),
     ['r', 'p', 't', 'pg_catalog'],
     ['relname:19']),
    ('sqlalchemy_psycopg',
     (
        'SELECT pg_catalog.pg_attribute.attname AS name, '
        'pg_catalog.format_type(pg_catalog.pg_attribute.atttypid, '
        'pg_catalog.pg_attribute.atttypmod) AS format_type, CASE WHEN '
        'pg_catalog.pg_attribute.atthasdef THEN (SELECT '
        'pg_catalog.pg_get_expr(pg_catalog.pg_attrdef.adbin, '
        'pg_catalog.pg_attrdef.adrelid) AS pg_get_expr_1 \n'
        'FROM pg_catalog.pg_attrdef \n'
        'WHERE pg_catalog.pg_attribute.atthasdef AND '
        'pg_catalog.pg_attrdef.adrelid = pg_catalog.pg_attribute.attrelid AND '
        'pg_catalog.pg_attrdef.adnum = pg_catalog.pg_attribute.attnum) ELSE '
        'NULL END AS "default", pg_catalog.pg_attribute.attnotnull AS '
        'not_null, pg_catalog.pg_class.relname AS table_name, '
        'pg_catalog.pg_description.description AS comment, '
        'pg_catalog.pg_attribute.attgenerated AS generated, CASE WHEN '
        '(pg_catalog.pg_attribute.attidentity != $1::VARCHAR) THEN (SELECT '
        'json_build_object($2::VARCHAR, pg_catalog.pg_attribute.attidentity = '
        '$3::VARCHAR, $4::VARCHAR, pg_catalog.pg_sequence.seqstart, '
        '$5::VARCHAR, pg_catalog.pg_sequence.seqincrement, $6::VARCHAR, '
        'pg_catalog.pg_sequence.seqmin, $7::VARCHAR, '
        'pg_catalog.pg_sequence.seqmax, $8::VARCHAR, '
        'pg_catalog.pg_sequence.seqcache, $9::VARCHAR, '
        'pg_catalog.pg_sequence.seqcycle) AS json_build_object_1 \n'
        'FROM pg_catalog.pg_sequence \n'
        'WHERE pg_catalog.pg_attribute.attidentity != $10::VARCHAR AND '
        'pg_catalog.pg_sequence.seqrelid = '
        'CAST(CAST(pg_catalog.pg_get_serial_sequence(CAST(CAST(pg_catalog.pg_at'
        'tribute.attrelid AS REGCLASS) AS TEXT), '
        'pg_catalog.pg_attribute.attname) AS REGCLASS) AS OID)) ELSE NULL END '
        'AS identity_options, CASE WHEN (pg_catalog.pg_attribute.attcollation '
        '!= $11::INTEGER AND (SELECT pg_catalog.pg_type.typcollation \n'
        'FROM pg_catalog.pg_type \n'
        'WHERE pg_catalog.pg_type.oid = pg_catalog.pg_attribute.atttypid) != '
        'pg_catalog.pg_attribute.attcollation) THEN (SELECT '
        'json_build_object($12::VARCHAR, pg_catalog.pg_collation.collname, '
        '$13::VARCHAR, CASE WHEN '
        'pg_catalog.pg_collation_is_visible(pg_catalog.pg_collation.oid) THEN '
        'NULL ELSE pg_catalog.pg_namespace.nspname END) AS json_build_object_9 '
        '\n'
        'FROM pg_catalog.pg_collation JOIN pg_catalog.pg_namespace ON '
        'pg_catalog.pg_namespace.oid = pg_catalog.pg_collation.collnamespace \n'
        'WHERE pg_catalog.pg_collation.oid = '
        'pg_catalog.pg_attribute.attcollation) ELSE NULL END AS collation \n'
        'FROM pg_catalog.pg_class LEFT OUTER JOIN pg_catalog.pg_attribute ON '
        'pg_catalog.pg_class.oid = pg_catalog.pg_attribute.attrelid AND '
        'pg_catalog.pg_attribute.attnum > $14::SMALLINT AND NOT '
        'pg_catalog.pg_attribute.attisdropped LEFT OUTER JOIN '
        'pg_catalog.pg_description ON pg_catalog.pg_description.objoid = '
        'pg_catalog.pg_attribute.attrelid AND '
        'pg_catalog.pg_description.objsubid = pg_catalog.pg_attribute.attnum '
        'JOIN pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = '
        'pg_catalog.pg_class.relnamespace \n'
        'WHERE pg_catalog.pg_class.relkind = ANY (ARRAY[$15::VARCHAR, '
        '$16::VARCHAR, $17::VARCHAR, $18::VARCHAR, $19::VARCHAR]) AND '
        'pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND '
        'pg_catalog.pg_namespace.nspname != $20::VARCHAR AND '
        'pg_catalog.pg_class.relname IN ($21::VARCHAR) ORDER BY '
        'pg_catalog.pg_class.relname, pg_catalog.pg_attribute.attnum'),
     ['', 'always', 'a', 'start', 'increment', 'minvalue', 'maxvalue', 'cache', 'cycle', '',
      0, 'name', 'schema', 0, 'r', 'p', 'f', 'v', 'm', 'pg_catalog', 'adult'],
     ['name:19', 'format_type:25', 'default:25', 'not_null:16', 'table_name:19',
      'comment:25', 'generated:18', 'identity_options:114', 'collation:114']),
    ('sqlalchemy_psycopg2',
     (
        'SELECT t.oid, typarray\n'
        'FROM pg_type t JOIN pg_namespace ns\n'
        '    ON typnamespace = ns.oid\n'
        "WHERE typname = 'hstore';\n"),
     None,
     ['oid:26', 'typarray:26']),
    ('sqlalchemy_psycopg2',
     (
        'SELECT pg_catalog.pg_namespace.nspname \n'
        'FROM pg_catalog.pg_namespace \n'
        "WHERE (pg_catalog.pg_namespace.nspname NOT LIKE 'pg/_' || '%' ESCAPE "
        "'/') ORDER BY pg_catalog.pg_namespace.nspname"),
     None,
     ['nspname:19']),
    ('sqlalchemy_psycopg2',
     (
        'SELECT pg_catalog.pg_class.relname \n'
        'FROM pg_catalog.pg_class JOIN pg_catalog.pg_namespace ON '
        'pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace \n'
        "WHERE pg_catalog.pg_class.relkind = ANY (ARRAY['r', 'p']) AND "
        "pg_catalog.pg_class.relpersistence != 't' AND "
        'pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND '
        "pg_catalog.pg_namespace.nspname != 'pg_catalog'"),
     None,
     ['relname:19']),
    ('sqlalchemy_psycopg2',
     (
        'SELECT pg_catalog.pg_attribute.attname AS name, '
        'pg_catalog.format_type(pg_catalog.pg_attribute.atttypid, '
        'pg_catalog.pg_attribute.atttypmod) AS format_type, CASE WHEN '
        'pg_catalog.pg_attribute.atthasdef THEN (SELECT '
        'pg_catalog.pg_get_expr(pg_catalog.pg_attrdef.adbin, '
        'pg_catalog.pg_attrdef.adrelid) AS pg_get_expr_1 \n'
        'FROM pg_catalog.pg_attrdef \n'
        'WHERE pg_catalog.pg_attribute.atthasdef AND '
        'pg_catalog.pg_attrdef.adrelid = pg_catalog.pg_attribute.attrelid AND '
        'pg_catalog.pg_attrdef.adnum = pg_catalog.pg_attribute.attnum) ELSE '
        'NULL END AS "default", pg_catalog.pg_attribute.attnotnull AS '
        'not_null, pg_catalog.pg_class.relname AS table_name, '
        'pg_catalog.pg_description.description AS comment, '
        'pg_catalog.pg_attribute.attgenerated AS generated, CASE WHEN '
        "(pg_catalog.pg_attribute.attidentity != '') THEN (SELECT "
        "json_build_object('always', pg_catalog.pg_attribute.attidentity = "
        "'a', 'start', pg_catalog.pg_sequence.seqstart, 'increment', "
        "pg_catalog.pg_sequence.seqincrement, 'minvalue', "
        "pg_catalog.pg_sequence.seqmin, 'maxvalue', "
        "pg_catalog.pg_sequence.seqmax, 'cache', "
        "pg_catalog.pg_sequence.seqcache, 'cycle', "
        'pg_catalog.pg_sequence.seqcycle) AS json_build_object_1 \n'
        'FROM pg_catalog.pg_sequence \n'
        "WHERE pg_catalog.pg_attribute.attidentity != '' AND "
        'pg_catalog.pg_sequence.seqrelid = '
        'CAST(CAST(pg_catalog.pg_get_serial_sequence(CAST(CAST(pg_catalog.pg_at'
        'tribute.attrelid AS REGCLASS) AS TEXT), '
        'pg_catalog.pg_attribute.attname) AS REGCLASS) AS OID)) ELSE NULL END '
        'AS identity_options, CASE WHEN (pg_catalog.pg_attribute.attcollation '
        '!= 0 AND (SELECT pg_catalog.pg_type.typcollation \n'
        'FROM pg_catalog.pg_type \n'
        'WHERE pg_catalog.pg_type.oid = pg_catalog.pg_attribute.atttypid) != '
        'pg_catalog.pg_attribute.attcollation) THEN (SELECT '
        "json_build_object('name', pg_catalog.pg_collation.collname, 'schema', "
        'CASE WHEN pg_catalog.pg_collation_is_visible(pg_catalog.pg_collation.o'
        'id) THEN NULL ELSE pg_catalog.pg_namespace.nspname END) AS '
        'json_build_object_9 \n'
        'FROM pg_catalog.pg_collation JOIN pg_catalog.pg_namespace ON '
        'pg_catalog.pg_namespace.oid = pg_catalog.pg_collation.collnamespace \n'
        'WHERE pg_catalog.pg_collation.oid = '
        'pg_catalog.pg_attribute.attcollation) ELSE NULL END AS collation \n'
        'FROM pg_catalog.pg_class LEFT OUTER JOIN pg_catalog.pg_attribute ON '
        'pg_catalog.pg_class.oid = pg_catalog.pg_attribute.attrelid AND '
        'pg_catalog.pg_attribute.attnum > 0 AND NOT '
        'pg_catalog.pg_attribute.attisdropped LEFT OUTER JOIN '
        'pg_catalog.pg_description ON pg_catalog.pg_description.objoid = '
        'pg_catalog.pg_attribute.attrelid AND '
        'pg_catalog.pg_description.objsubid = pg_catalog.pg_attribute.attnum '
        'JOIN pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = '
        'pg_catalog.pg_class.relnamespace \n'
        "WHERE pg_catalog.pg_class.relkind = ANY (ARRAY['r', 'p', 'f', 'v', "
        "'m']) AND pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND "
        "pg_catalog.pg_namespace.nspname != 'pg_catalog' AND "
        "pg_catalog.pg_class.relname IN ('adult') ORDER BY "
        'pg_catalog.pg_class.relname, pg_catalog.pg_attribute.attnum'),
     None,
     ['name:19', 'format_type:25', 'default:25', 'not_null:16', 'table_name:19',
      'comment:25', 'generated:18', 'identity_options:114', 'collation:114']),
]
SESSION_STATEMENTS: list[str] = [
    (
        'SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation ORDER '
        'BY occupation'),
    'SELECT COUNT(*) FROM adult WHERE age > $1',
    "SELECT 'happy'::mood AS m",
    'SELECT COUNT(*) FROM adult',
    (
        'SELECT pg_advisory_unlock_all();\n'
        'CLOSE ALL;\n'
        'UNLISTEN *;\n'
        'RESET ALL;'),
    'BEGIN',
    'COMMIT',
    'SAVEPOINT "_pg3_1"',
    'RELEASE "_pg3_1"',
    'ROLLBACK',
    'SELECT COUNT(*) AS n FROM adult WHERE age > $1',
    'SELECT occupation, COUNT(*) FROM adult GROUP BY occupation',
    'SELECT COUNT(*) FROM adult WHERE age > $1 AND occupation = $2',
    'SELECT $1::float8 AS x',
    'SELECT 1',
    'SELECT COUNT(*) FROM adult WHERE age > 30',
]


ROOT = Path(__file__).resolve().parent.parent
DEMO_POLICY = ROOT / "policies" / "demo.toml"
ADULT_COLUMNS = ["person_id", "age", "sex", "education", "education_num", "hours_per_week",
                 "capital_gain", "income", "occupation"]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(DEMO_POLICY)


@pytest.fixture(scope="module")
def catalog(policy: Policy) -> Catalog:
    return Catalog(policy, policy.analysts["alice"], database=policy.database, user="alice",
                   backend_pid=4242)


def only_adult(policy: Policy) -> Catalog:
    analyst = dataclasses.replace(policy.analysts["alice"], tables=("adult",))
    return Catalog(policy, analyst, database=policy.database, user="alice")


def shape(result: Any) -> list[str]:
    return [f"{c}:{TYPE_OIDS[t]}" for c, t in zip(result.columns, result.types, strict=True)]


def reference(client: str, start: str) -> tuple[str, list[Any] | None]:
    """A reference statement by client and first words."""
    for name, sql, params, _ in CATALOG_QUERIES:
        if name == client and sql.lstrip().startswith(start):
            return sql, params
    raise LookupError(start)


# -- every reference statement ------------------------------------------------------------------

@pytest.mark.parametrize(("client", "sql", "params", "expected"), CATALOG_QUERIES,
                         ids=[f"{q[0]}-{i}" for i, q in enumerate(CATALOG_QUERIES)])
def test_reference_catalog_statement_has_postgres_columns(
        catalog: Catalog, client: str, sql: str, params: list[Any] | None,
        expected: list[str]) -> None:
    result = catalog.answer(sql, params)
    assert result is not None
    assert shape(result) == expected
    assert result.tag in (f"SELECT {len(result.rows)}", "SHOW")
    described = catalog.describe(sql)
    assert described is not None
    assert (list(described.columns), list(described.types)) == (list(result.columns),
                                                                 list(result.types))


@pytest.mark.parametrize("sql", SESSION_STATEMENTS)
def test_reference_non_catalog_statement_goes_to_the_session(catalog: Catalog, sql: str
                                                             ) -> None:
    assert catalog.answer(sql) is None
    assert catalog.describe(sql) is None


# -- psql -----------------------------------------------------------------------------------------

def test_psql_dt_lists_exactly_the_granted_tables(catalog: Catalog, policy: Policy) -> None:
    result = catalog.answer(*reference("psql_dt", "SELECT n.nspname"))
    assert result is not None
    assert result.rows == [("public", name, "table", "dpproxy")
                           for name in sorted(policy.analysts["alice"].tables)]
    narrow = only_adult(policy).answer(*reference("psql_dt", "SELECT n.nspname"))
    assert narrow is not None and narrow.rows == [("public", "adult", "table", "dpproxy")]


def test_psql_d_adult_lists_the_policy_columns(catalog: Catalog) -> None:
    found = catalog.answer(*reference("psql_d_table", "SELECT c.oid"))
    assert found is not None and len(found.rows) == 1
    oid, schema, name = found.rows[0]
    assert (schema, name) == ("public", "adult")
    # psql asks the next questions about the oid it was given (16391 on the reference server)
    table = catalog.answer(reference("psql_d_table", "SELECT c.relchecks")[0].replace(
        "16391", str(oid)))
    assert table is not None and table.rows[0][1] == "r" and table.rows[0][-1] == "heap"
    columns = catalog.answer(reference("psql_d_table", "SELECT a.attname")[0].replace(
        "16391", str(oid)))
    assert columns is not None
    assert [(r[0], r[1], r[3]) for r in columns.rows] == [
        (c, "text" if c in ("sex", "education", "income", "occupation") else "bigint",
         c != "occupation") for c in ADULT_COLUMNS]
    for start in ("SELECT pol.polname", "SELECT oid, stxrelid", "SELECT pubname",
                  "SELECT c.oid::pg_catalog.regclass\n"):
        footer = catalog.answer(reference("psql_d_table", start)[0].replace("16391", str(oid)))
        assert footer is not None and footer.rows == []


def test_psql_l_dn_and_completion(catalog: Catalog) -> None:
    databases = catalog.answer(*reference("psql_l", "SELECT d.datname"))
    assert databases is not None
    assert databases.rows == [("demo", "dpproxy", "UTF8", "C.UTF-8", "C.UTF-8", None, "libc",
                               None)]
    schemas = catalog.answer(*reference("psql_dn", "SELECT n.nspname"))
    assert schemas is not None and schemas.rows == [("public", "dpproxy")]
    completion = catalog.answer(*reference("psql_interactive", "SELECT c.relname"))
    assert completion is not None and completion.rows == [("adult", None)]


def test_psql_regex_operator_collate_and_like_escape(catalog: Catalog) -> None:
    result = catalog.answer("SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relname "
                            "OPERATOR(pg_catalog.~) '^(vis.*)$' COLLATE pg_catalog.default")
    assert result is not None and result.rows == [("visits",)]
    escaped = catalog.answer("SELECT nspname FROM pg_namespace WHERE nspname LIKE E'pg\\\\_%' "
                             "OR nspname ~* '^INFO' ORDER BY 1")
    assert escaped is not None and escaped.rows == [("information_schema",), ("pg_catalog",)]


# psql 15's \d+ adds to \d's table query the options (toast ones through a correlated
# `pg_catalog.unnest`) and to its column query storage, compression and statistics target.
PSQL_D_PLUS_TABLE = (
    "SELECT c.relchecks, c.relkind, c.relhasindex, c.relhasrules, c.relhastriggers, "
    "c.relrowsecurity, c.relforcerowsecurity, false AS relhasoids, c.relispartition, "
    "pg_catalog.array_to_string(c.reloptions || array(select 'toast.' || x from "
    "pg_catalog.unnest(tc.reloptions) x), ', ')\n, c.reltablespace, CASE WHEN c.reloftype = 0 "
    "THEN '' ELSE c.reloftype::pg_catalog.regtype::pg_catalog.text END, c.relpersistence, "
    "c.relreplident, am.amname\nFROM pg_catalog.pg_class c\n LEFT JOIN pg_catalog.pg_class tc "
    "ON (c.reltoastrelid = tc.oid)\nLEFT JOIN pg_catalog.pg_am am ON (c.relam = am.oid)\n"
    "WHERE c.oid = '{oid}';")
PSQL_D_PLUS_COLUMNS = (
    "SELECT a.attname,\n  pg_catalog.format_type(a.atttypid, a.atttypmod),\n"
    "  (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true)\n"
    "   FROM pg_catalog.pg_attrdef d\n"
    "   WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef),\n"
    "  a.attnotnull,\n"
    "  (SELECT c.collname FROM pg_catalog.pg_collation c, pg_catalog.pg_type t\n"
    "   WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND a.attcollation <> "
    "t.typcollation) AS attcollation,\n"
    "  a.attidentity,\n  a.attgenerated,\n  a.attstorage,\n"
    "  a.attcompression AS attcompression,\n"
    "  CASE WHEN a.attstattarget=-1 THEN NULL ELSE a.attstattarget END AS attstattarget,\n"
    "  pg_catalog.col_description(a.attrelid, a.attnum)\n"
    "FROM pg_catalog.pg_attribute a\n"
    "WHERE a.attrelid = '{oid}' AND a.attnum > 0 AND NOT a.attisdropped\n"
    "ORDER BY a.attnum;")


def test_psql_d_plus_adult_is_a_catalog_query(catalog: Catalog,
                                              caplog: pytest.LogCaptureFixture) -> None:
    found = catalog.answer("SELECT 'adult'::regclass::oid")
    assert found is not None
    oid = found.rows[0][0]
    with caplog.at_level(logging.WARNING, logger="dpproxy.catalog"):
        table = catalog.answer(PSQL_D_PLUS_TABLE.format(oid=oid))
        columns = catalog.answer(PSQL_D_PLUS_COLUMNS.format(oid=oid))
    assert not [r for r in caplog.records if r.name == "dpproxy.catalog"]
    assert table is not None and shape(table) == [
        "relchecks:21", "relkind:18", "relhasindex:16", "relhasrules:16", "relhastriggers:16",
        "relrowsecurity:16", "relforcerowsecurity:16", "relhasoids:16", "relispartition:16",
        "array_to_string:25", "reltablespace:26", "reloftype:25", "relpersistence:18",
        "relreplident:18", "amname:19"]
    assert (table.rows[0][1], table.rows[0][9] or "", table.rows[0][-1]) == ("r", "", "heap")
    assert columns is not None and shape(columns) == [
        "attname:19", "format_type:25", "pg_get_expr:25", "attnotnull:16", "attcollation:19",
        "attidentity:18", "attgenerated:18", "attstorage:18", "attcompression:18",
        "attstattarget:23", "col_description:25"]
    assert [(r[0], r[7]) for r in columns.rows] == [
        (c, "x" if c in ("sex", "education", "income", "occupation") else "p")
        for c in ADULT_COLUMNS]


def test_unnest_with_the_catalog_prefix_yields_its_element_type(catalog: Catalog) -> None:
    result = catalog.answer("SELECT s.x FROM pg_catalog.pg_class c, "
                            "pg_catalog.unnest(ARRAY[c.relname]) AS s(x) "
                            "WHERE c.relname = 'adult'")
    assert result is not None
    assert (result.columns, result.types, result.rows) == (("x",), ("name",), [("adult",)])


# -- drivers and ORMs ------------------------------------------------------------------------

def test_asyncpg_type_introspection_returns_the_requested_types(catalog: Catalog) -> None:
    sql, _ = reference("asyncpg", "WITH RECURSIVE typeinfo_tree")
    for requested in ([20, 1009], "{20,1009}"):
        result = catalog.answer(sql, [requested])
        assert result is not None
        rows = {row[0]: dict(zip(result.columns, row, strict=True)) for row in result.rows}
        assert set(rows) == {20, 1009, 25}  # _text brings its element type along
        assert (rows[1009]["name"], rows[1009]["elemtype"], rows[1009]["elemtype_name"]) == (
            "_text", 25, "text")
        assert (rows[25]["depth"], rows[20]["kind"], rows[20]["ns"]) == (1, "b", "pg_catalog")
    assert catalog.parameter_types(sql) == ("_oid",)


def test_sqlalchemy_has_table_sees_only_granted_tables(catalog: Catalog, policy: Policy
                                                       ) -> None:
    sql, params = reference("pandas_sqlalchemy", "SELECT pg_catalog.pg_class.relname")
    assert params is not None

    def has_table(name: str, cat: Catalog = catalog) -> bool:
        result = cat.answer(sql, [name, *params[1:]])
        assert result is not None
        return bool(result.rows)

    assert has_table("adult") and has_table("visits")
    assert not has_table("secret")
    assert not has_table("visits", only_adult(policy))
    assert catalog.parameter_types(sql) == ("varchar",) * 7


def test_sqlalchemy_reflection(catalog: Catalog) -> None:
    names = catalog.answer(*reference("sqlalchemy_psycopg2", "SELECT pg_catalog.pg_class"))
    assert names is not None
    assert sorted(r[0] for r in names.rows) == ["adult", "occupation_groups", "visits"]
    columns = catalog.answer(*reference("sqlalchemy_psycopg", "SELECT pg_catalog.pg_attribute"))
    assert columns is not None
    assert [r[0] for r in columns.rows] == ADULT_COLUMNS
    assert {r[1] for r in columns.rows} == {"bigint", "text"}
    hstore = catalog.answer(*reference("pandas_sqlalchemy", "SELECT\n    typname"))
    assert hstore is not None and hstore.rows == []
    int8 = catalog.answer(reference("pandas_sqlalchemy", "SELECT\n    typname")[0], ["int8"])
    assert int8 is not None and int8.rows == [("int8", 20, 1016, "bigint", ",")]


def test_version_settings_and_session_functions(policy: Policy) -> None:
    settings = {"datestyle": "German, DMY"}
    catalog = Catalog(policy, policy.analysts["alice"], database="demo", user="alice",
                      server_version="15.4", settings=settings, backend_pid=7)
    version = catalog.answer("select pg_catalog.version()")
    assert version is not None and version.rows[0][0].startswith("PostgreSQL 15.4 ")
    shown = catalog.answer("SHOW datestyle")
    assert shown is not None and (shown.columns, shown.rows) == (("DateStyle",),
                                                                 [("German, DMY",)])
    assert catalog.describe("SHOW TIME ZONE") is not None
    assert catalog.answer("SHOW dpproxy.epsilon") is None  # the session's own options
    assert catalog.answer("SHOW ALL") is None
    result = catalog.answer(
        "SELECT current_setting('server_version_num'), set_config('jit', 'on', false), "
        "current_database(), current_user, session_user, current_schema, "
        "current_schemas(true), pg_backend_pid(), user")
    assert result is not None
    assert result.rows == [("150004", "on", "demo", "alice", "alice", "public",
                            ["pg_catalog", "public"], 7, "alice")]
    assert result.types == ("text", "text", "name", "name", "name", "name", "_name", "int4",
                            "name")
    assert settings["jit"] == "on"
    with pytest.raises(Exception, match="unrecognized configuration parameter") as raised:
        catalog.answer("SELECT current_setting('no_such_setting')")
    assert getattr(raised.value, "sqlstate", None) == "42704"
    # set_config of a dpproxy option answered its new value while the session kept the old
    with pytest.raises(Exception, match=r"SET dpproxy\.epsilon") as refused:
        catalog.answer("SELECT set_config('dpproxy.epsilon', '1e-30', false)")
    assert getattr(refused.value, "sqlstate", None) == "0A000"
    assert "dpproxy.epsilon" not in settings


@pytest.mark.parametrize(("setting", "value"), [
    ("default_table_access_method", "heap"),  # SQLAlchemy's table reflection
    ("default_tablespace", ""),  # pgAdmin's database properties
    ("password_encryption", "scram-sha-256"),  # libpq's PQencryptPasswordConn
])
def test_settings_clients_read_have_postgres_values(catalog: Catalog, setting: str,
                                                    value: str) -> None:
    for sql in (f"SELECT current_setting('{setting}')", f"SHOW {setting}",
                f"SELECT setting FROM pg_settings WHERE name = '{setting}'"):
        result = catalog.answer(sql)
        assert result is not None and result.rows == [(value,)], sql


def test_current_setting_of_a_parameter(catalog: Catalog) -> None:
    # psycopg casts its parameters (`$1::VARCHAR`); Describe runs before any are bound
    for sql in ("SELECT current_setting($1)", "SELECT current_setting($1::VARCHAR)"):
        described = catalog.describe(sql)
        assert described is not None and described.types == ("text",)
        result = catalog.answer(sql, ["default_table_access_method"])
        assert result is not None and result.rows == [("heap",)]
    unset = catalog.answer("SELECT current_setting(NULL)")
    assert unset is not None and unset.rows == [(None,)]


def test_reg_casts_resolve_names_and_oids(catalog: Catalog) -> None:
    result = catalog.answer("SELECT 'adult'::regclass, 'adult'::regclass::oid > 16384, "
                            "'pg_class'::regclass::oid, 'int8'::regtype, 23::regtype::text, "
                            "'information_schema.tables'::regclass, 'secret'::regclass")
    assert result is not None
    assert result.rows == [("adult", True, 1259, "bigint", "integer",
                            "information_schema.tables", None)]
    assert result.types == ("regclass", "bool", "oid", "regtype", "text", "regclass",
                            "regclass")


def test_information_schema_lists_granted_tables_and_columns(catalog: Catalog) -> None:
    tables = catalog.answer("SELECT table_name, table_type FROM information_schema.tables "
                            "WHERE table_schema = 'public' ORDER BY 1")
    assert tables is not None
    assert tables.rows == [(n, "BASE TABLE") for n in ("adult", "occupation_groups", "visits")]
    columns = catalog.answer("SELECT column_name, data_type, is_nullable FROM "
                             "information_schema.columns WHERE table_name = 'visits' "
                             "ORDER BY ordinal_position")
    assert columns is not None
    assert columns.rows == [("visit_id", "bigint", "NO"), ("person_id", "bigint", "NO"),
                            ("day", "date", "NO"), ("amount", "double precision", "NO")]


# -- what never leaves ------------------------------------------------------------------------

def test_an_analyst_sees_only_granted_tables_and_columns(policy: Policy) -> None:
    catalog = only_adult(policy)
    for sql in ("SELECT relname FROM pg_class WHERE relnamespace = 2200",
                "SELECT DISTINCT table_name FROM information_schema.columns "
                "WHERE table_schema = 'public'",
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"):
        result = catalog.answer(sql)
        assert result is not None and result.rows == [("adult",)], sql
    hidden = catalog.answer("SELECT count(*) FROM pg_attribute a JOIN pg_class c "
                            "ON c.oid = a.attrelid WHERE c.relname = 'visits'")
    assert hidden is not None and hidden.rows == [(0,)]


def test_sizes_are_null(catalog: Catalog) -> None:
    result = catalog.answer(
        "SELECT c.reltuples, c.relpages, c.relallvisible, pg_catalog.pg_relation_size(c.oid), "
        "pg_total_relation_size(c.oid), pg_table_size(c.oid), pg_indexes_size(c.oid), "
        "pg_size_pretty(pg_total_relation_size(c.oid)), pg_database_size(current_database()) "
        "FROM pg_catalog.pg_class c WHERE c.relname = 'adult'")
    assert result is not None and result.rows == [(None,) * 9]


@pytest.mark.parametrize("sql", [
    "SELECT relname, n_live_tup FROM pg_stat_user_tables",
    "SELECT * FROM pg_catalog.pg_stats WHERE tablename = 'adult'",
    "SELECT * FROM pg_catalog.pg_statio_user_tables",
    "SELECT pid FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    "SELECT c.relname FROM pg_class c JOIN pg_catalog.pg_statistic s ON s.starelid = c.oid",
])
def test_statistics_views_do_not_exist(catalog: Catalog, sql: str) -> None:
    with pytest.raises(UndefinedTable) as raised:
        catalog.answer(sql)
    assert raised.value.sqlstate == "42P01"


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult",
    "SELECT 1 FROM adult JOIN pg_class ON true",
    "SELECT relname FROM pg_class WHERE relname IN (SELECT occupation FROM adult)",
    "SELECT count(*) FROM public.pg_class",
    "SELECT * FROM read_csv('x.csv') JOIN pg_type ON true",
    "SELECT 1 FROM demo.pg_catalog.pg_class, other.public.adult",
    "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation",
    "DELETE FROM pg_class",
    "SELECT 1; SELECT version()",
])
def test_statements_reading_anything_else_go_to_the_session(catalog: Catalog, sql: str
                                                            ) -> None:
    assert catalog.answer(sql) is None


def test_unknown_catalog_shapes_are_empty_named_and_logged(
        catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dpproxy.catalog"):
        relation = catalog.answer("SELECT srvname, x AS y FROM pg_catalog.pg_user_mapping")
        column = catalog.answer("SELECT relname, no_such_column FROM pg_class")
    assert relation is not None and (relation.columns, relation.rows) == (("srvname", "y"), [])
    assert column is not None and (column.columns, column.rows) == (
        ("relname", "no_such_column"), [])
    assert len([r for r in caplog.records if r.name == "dpproxy.catalog"]) == 2


def test_the_data_backend_is_never_opened(tmp_path: Path) -> None:
    absent = tmp_path / "absent.duckdb"
    file = tmp_path / "policy.toml"
    file.write_text(DEMO_POLICY.read_text().replace('path = "../data/demo.duckdb"',
                                                    f'path = "{absent.as_posix()}"'))
    policy = load_policy(file)
    catalog = Catalog(policy, policy.analysts["alice"], database="demo", user="alice")
    for _, sql, params, _ in CATALOG_QUERIES:
        catalog.answer(sql, params)
    assert not absent.exists()



# -- other tools ------------------------------------------------------------------------------

JDBC_GET_TABLES = (
    "SELECT NULL AS TABLE_CAT, n.nspname AS TABLE_SCHEM, c.relname AS TABLE_NAME, "
    "CASE n.nspname ~ '^pg_' OR n.nspname = 'information_schema' WHEN true THEN 'SYSTEM' "
    "WHEN false THEN CASE c.relkind WHEN 'r' THEN 'TABLE' WHEN 'v' THEN 'VIEW' ELSE NULL END "
    "ELSE NULL END AS TABLE_TYPE, d.description AS REMARKS "
    "FROM pg_catalog.pg_namespace n, pg_catalog.pg_class c "
    "LEFT JOIN pg_catalog.pg_description d ON (c.oid = d.objoid AND d.objsubid = 0 "
    "AND d.classoid = 'pg_class'::regclass) WHERE c.relnamespace = n.oid "
    "AND c.relname LIKE '%' AND (false OR (c.relkind = 'r' AND n.nspname !~ '^pg_' "
    "AND n.nspname <> 'information_schema')) ORDER BY TABLE_TYPE, TABLE_SCHEM, TABLE_NAME")
JDBC_GET_COLUMNS = (
    "SELECT * FROM (SELECT n.nspname, c.relname, a.attname, a.atttypid, "
    "a.attnotnull OR (t.typtype = 'd' AND t.typnotnull) AS attnotnull, a.atttypmod, "
    "row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum) AS attnum, "
    "nullif(a.attidentity, '') AS attidentity, "
    "pg_catalog.pg_get_expr(def.adbin, def.adrelid) AS adsrc, dsc.description "
    "FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_class c ON (c.relnamespace = n.oid) "
    "JOIN pg_catalog.pg_attribute a ON (a.attrelid = c.oid) "
    "JOIN pg_catalog.pg_type t ON (a.atttypid = t.oid) "
    "LEFT JOIN pg_catalog.pg_attrdef def ON (a.attrelid = def.adrelid AND a.attnum = def.adnum) "
    "LEFT JOIN pg_catalog.pg_description dsc ON (c.oid = dsc.objoid "
    "AND a.attnum = dsc.objsubid) WHERE c.relkind IN ('r','p','v','f','m') AND a.attnum > 0 "
    "AND NOT a.attisdropped AND c.relname LIKE 'visits') c WHERE true "
    "ORDER BY nspname, c.relname, attnum")
# psqlODBC's SQLColumns: its FROM is a parenthesized join group
ODBC_COLUMNS = (
    "select n.nspname, c.relname, a.attname, a.atttypid, t.typname, a.attnum, a.attlen, "
    "a.atttypmod, a.attnotnull, c.relhasrules, c.relkind, c.oid, "
    "pg_get_expr(d.adbin, d.adrelid), case t.typtype when 'd' then t.typbasetype else 0 end, "
    "t.typtypmod, 0, attidentity, c.relhassubclass from (((pg_catalog.pg_class c "
    "inner join pg_catalog.pg_namespace n on n.oid = c.relnamespace and c.relname like "
    "'visits' and n.nspname like 'public') inner join pg_catalog.pg_attribute a on "
    "(not a.attisdropped) and a.attnum > 0 and a.attrelid = c.oid) inner join "
    "pg_catalog.pg_type t on t.oid = a.atttypid) left outer join pg_attrdef d on "
    "a.atthasdef and d.adrelid = a.attrelid and d.adnum = a.attnum "
    "order by n.nspname, c.relname, attnum")
PSQL_DU = (
    "SELECT r.rolname, r.rolsuper, r.rolinherit, r.rolcreaterole, r.rolcreatedb, "
    "r.rolcanlogin, r.rolconnlimit, r.rolvaliduntil, ARRAY(SELECT b.rolname "
    "FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) "
    "WHERE m.member = r.oid) as memberof, r.rolreplication, r.rolbypassrls "
    "FROM pg_catalog.pg_roles r WHERE r.rolname !~ '^pg_' ORDER BY 1;")
PSQL_L_PLUS = (
    "SELECT d.datname as \"Name\", CASE WHEN pg_catalog.has_database_privilege(d.datname, "
    "'CONNECT') THEN pg_catalog.pg_size_pretty(pg_catalog.pg_database_size(d.datname)) "
    "ELSE 'No Access' END as \"Size\", t.spcname as \"Tablespace\", "
    "pg_catalog.shobj_description(d.oid, 'pg_database') as \"Description\" "
    "FROM pg_catalog.pg_database d JOIN pg_catalog.pg_tablespace t "
    "on d.dattablespace = t.oid ORDER BY 1;")


@pytest.mark.parametrize(("sql", "columns", "rows"), [
    (JDBC_GET_TABLES, ("table_cat", "table_schem", "table_name", "table_type", "remarks"),
     [(None, "public", n, "TABLE", None) for n in ("adult", "occupation_groups", "visits")]),
    (JDBC_GET_COLUMNS, ("nspname", "relname", "attname", "atttypid", "attnotnull",
                        "atttypmod", "attnum", "attidentity", "adsrc", "description"),
     [("public", "visits", name, oid, True, -1, i, None, None, None) for i, (name, oid) in
      enumerate([("visit_id", 20), ("person_id", 20), ("day", 1082), ("amount", 701)], 1)]),
    (ODBC_COLUMNS, ("nspname", "relname", "attname", "atttypid", "typname", "attnum",
                    "attlen", "atttypmod", "attnotnull", "relhasrules", "relkind", "oid",
                    "pg_get_expr", "case", "typtypmod", "?column?", "attidentity",
                    "relhassubclass"), None),
    (PSQL_DU, ("rolname", "rolsuper", "rolinherit", "rolcreaterole", "rolcreatedb",
               "rolcanlogin", "rolconnlimit", "rolvaliduntil", "memberof", "rolreplication",
               "rolbypassrls"),
     [("alice", False, True, False, False, True, -1, None, [], False, False),
      ("dpproxy", True, True, True, True, False, -1, None, [], False, False)]),
    (PSQL_L_PLUS, ("Name", "Size", "Tablespace", "Description"),
     [("demo", None, "pg_default", None)]),
])
def test_other_tools_catalog_queries(catalog: Catalog, sql: str, columns: tuple[str, ...],
                                     rows: list[tuple[Any, ...]] | None) -> None:
    result = catalog.answer(sql)
    assert result is not None
    assert result.columns == columns
    if rows is not None:
        assert result.rows == rows
    else:  # ODBC_COLUMNS: the columns of visits, in order, with their types
        assert [(r[2], r[4], r[5]) for r in result.rows] == [
            ("visit_id", "int8", 1), ("person_id", "int8", 2), ("day", "date", 3),
            ("amount", "float8", 4)]


def test_parameters_bind_as_literals(catalog: Catalog) -> None:
    sql = "SELECT relname FROM pg_class WHERE relname = $1 OR oid = ANY($2::oid[])"
    assert catalog.parameter_types(sql) == ("name", "_oid")
    result = catalog.answer(sql, ["visits", [1259]])
    assert result is not None and sorted(result.rows) == [("pg_class",), ("visits",)]
    with pytest.raises(Exception, match="no placeholders"):
        catalog.answer("SELECT version()", ["x"])


def test_a_running_catalog_query_can_be_interrupted(policy: Policy) -> None:
    catalog = Catalog(policy, policy.analysts["alice"], database="demo", user="alice")
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(catalog.answer(
                "SELECT count(*) FROM pg_attribute a, pg_attribute b, pg_attribute c, "
                "pg_attribute d WHERE a.attname || b.attname || c.attname <> d.attname"))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(0.3)
    catalog.interrupt()
    worker.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], QueryCanceled)
    assert outcome[0].sqlstate == "57014"


def test_a_table_named_with_its_schema_quoted_is_found(catalog: Catalog) -> None:
    """Metabase's privilege check quotes schema and table ('"public"."adult"'): it found
    no table, so has_table_privilege said false and the tool hid every table."""
    spellings = ["adult", '"adult"', "public.adult", 'public."adult"', '"public".adult',
                 '"public"."adult"']
    result = catalog.answer("SELECT " + ", ".join(
        f"has_table_privilege(current_user, '{s}', 'SELECT')" for s in spellings)
        + ", " + ", ".join(f"to_regclass('{s}')::oid" for s in spellings))
    assert result is not None
    privileges, oids = result.rows[0][:6], result.rows[0][6:]
    assert privileges == (True,) * 6
    assert len(set(oids)) == 1 and oids[0] is not None


def test_pg_get_keywords_lists_postgresql_15s_keywords(catalog: Catalog) -> None:
    """pgjdbc's getSQLKeywords() (DBeaver sets up its dialect with it) read
    pg_get_keywords(), which was refused: in manual-commit mode that aborted the
    transaction and every later metadata call. PostgreSQL 15 has 460 keywords, 77 of
    them reserved."""
    result = catalog.answer(
        "SELECT count(*), count(*) FILTER (WHERE catcode = 'R'), "
        "string_agg(word, ',' ORDER BY word) FILTER (WHERE NOT barelabel AND catcode = 'T') "
        "FROM pg_get_keywords()")
    assert result is not None
    assert result.rows == [(460, 77, "isnull,notnull,overlaps")]
    jdbc = catalog.answer(  # pgjdbc's own query
        "select string_agg(word, ',') from pg_catalog.pg_get_keywords() "
        "where word <> ALL ('{a,abs,absolute}'::text[])")
    assert jdbc is not None and "select" in jdbc.rows[0][0].split(",")
    listed = catalog.answer("SELECT count(*) FROM pg_class WHERE relname LIKE '%keyword%'")
    assert listed is not None and listed.rows == [(0,)]


def test_a_catalog_answer_is_bounded_in_bytes(catalog: Catalog) -> None:
    """max_result_rows bounds rows, not their width: repeat('x', 5000) over a cross join
    held 450 MB per connection. An answer beyond MAX_CATALOG_BYTES is refused (54000)."""
    with pytest.raises(errors.ProgramLimitExceeded, match="larger than 64 MB"):
        catalog.answer("SELECT repeat('x', 100000) FROM pg_catalog.pg_attribute a, "
                       "pg_catalog.pg_attribute b LIMIT 1000")
    with pytest.raises(errors.ProgramLimitExceeded, match="larger than 64 MB"):
        catalog.answer("SELECT array_agg(repeat('x', 250)) FROM pg_catalog.pg_attribute a, "
                       "pg_catalog.pg_attribute b")  # one row, its array counted whole
    small = catalog.answer("SELECT repeat('x', 1000) FROM pg_catalog.pg_attribute LIMIT 10")
    assert small is not None and len(small.rows) == 10
