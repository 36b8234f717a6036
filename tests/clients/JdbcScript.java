// Runs a script of statements through the PostgreSQL JDBC driver (pgjdbc), as a Java
// application would: tests/test_jdbc.py feeds it and reads one JSON line per command.
//
//   java -cp postgresql.jar JdbcScript.java <jdbc url> <user> <password> < script
//
// Commands, one per line, fields separated by tabs:
//   execute <sql>                               Statement.execute (SET, BEGIN, …)
//   query  <times> <sql> [<type>:<value> ...]   a PreparedStatement run <times> times
//   fetch  <size>  <sql>                        a Statement with setFetchSize, autocommit off
//   tables                                      DatabaseMetaData.getTables(…, {"TABLE"})
//   columns <table>                             DatabaseMetaData.getColumns(…, table, "%")
// Parameter types: int, long, double, decimal, string, bool, date, localdate, timestamp,
// null. `execute` prints {"ok": true}; every other command prints {"columns": [[label, type name], …], "rows": [[text, …], …]}
// (the rows of its last run, values as getString reads them) or {"error": SQLSTATE,
// "message": first line}.

import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.LocalDate;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

public class JdbcScript {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (Connection conn = DriverManager.getConnection(args[0], args[1], args[2])) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) continue;
                String[] f = line.split("\t", -1);
                try {
                    System.out.println(run(conn, f));
                } catch (SQLException e) {
                    String message = e.getMessage() == null ? "" : e.getMessage().split("\n")[0];
                    System.out.println("{\"error\": " + json(e.getSQLState()) + ", \"message\": "
                                       + json(message) + "}");
                    if (!conn.getAutoCommit()) {
                        conn.rollback();
                        conn.setAutoCommit(true);
                    }
                }
                System.out.flush();
            }
        }
    }

    static String run(Connection conn, String[] f) throws SQLException {
        DatabaseMetaData meta = conn.getMetaData();
        switch (f[0]) {
            case "execute":
                try (Statement s = conn.createStatement()) {
                    s.execute(f[1]);
                    return "{\"ok\": true}";
                }
            case "query": {
                String out = null;
                try (PreparedStatement ps = conn.prepareStatement(f[2])) {
                    for (int i = 3; i < f.length; i++) bind(ps, i - 2, f[i]);
                    for (int n = Integer.parseInt(f[1]); n > 0; n--) {
                        try (ResultSet rs = ps.executeQuery()) { out = result(rs); }
                    }
                }
                return out;
            }
            case "fetch": {
                conn.setAutoCommit(false);
                try (Statement s = conn.createStatement()) {
                    s.setFetchSize(Integer.parseInt(f[1]));
                    try (ResultSet rs = s.executeQuery(f[2])) {
                        String out = result(rs);
                        conn.commit();
                        conn.setAutoCommit(true);
                        return out;
                    }
                }
            }
            case "tables":
                try (ResultSet rs = meta.getTables(null, null, "%", new String[] {"TABLE"})) {
                    return result(rs);
                }
            case "columns":
                try (ResultSet rs = meta.getColumns(null, null, f[1], "%")) { return result(rs); }
            case "keywords":  // what DBeaver reads to set up its SQL dialect (words a-z only)
                return "{\"keywords\": \"" + meta.getSQLKeywords() + "\"}";
            default:
                throw new IllegalArgumentException("unknown command " + f[0]);
        }
    }

    static void bind(PreparedStatement ps, int index, String param) throws SQLException {
        String type = param.substring(0, param.indexOf(':'));
        String value = param.substring(param.indexOf(':') + 1);
        switch (type) {
            case "int" -> ps.setInt(index, Integer.parseInt(value));
            case "long" -> ps.setLong(index, Long.parseLong(value));
            case "double" -> ps.setDouble(index, Double.parseDouble(value));
            case "decimal" -> ps.setBigDecimal(index, new BigDecimal(value));
            case "string" -> ps.setString(index, value);
            case "bool" -> ps.setBoolean(index, Boolean.parseBoolean(value));
            case "date" -> ps.setDate(index, java.sql.Date.valueOf(value));
            case "localdate" -> ps.setObject(index, LocalDate.parse(value));
            case "timestamp" -> ps.setTimestamp(index, java.sql.Timestamp.valueOf(value));
            case "null" -> ps.setNull(index, Types.INTEGER);
            default -> throw new IllegalArgumentException("unknown parameter type " + type);
        }
    }

    static String result(ResultSet rs) throws SQLException {
        ResultSetMetaData m = rs.getMetaData();
        StringBuilder b = new StringBuilder("{\"columns\": [");
        for (int i = 1; i <= m.getColumnCount(); i++) {
            b.append(i > 1 ? ", " : "").append("[").append(json(m.getColumnLabel(i))).append(", ")
             .append(json(m.getColumnTypeName(i))).append("]");
        }
        b.append("], \"rows\": [");
        boolean first = true;
        while (rs.next()) {
            b.append(first ? "[" : ", [");
            first = false;
            for (int i = 1; i <= m.getColumnCount(); i++) {
                b.append(i > 1 ? ", " : "").append(json(rs.getString(i)));
            }
            b.append("]");
        }
        return b.append("]}").toString();
    }

    static String json(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }
}
