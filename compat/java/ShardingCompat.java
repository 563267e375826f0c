import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

/**
 * Prints, for each sharding key read on stdin, the hash and the partitions the youzan Java
 * SDK would choose: {@code Math.abs(key.hashCode() % partitionNum)} with the key boxed as the
 * SDK boxes it ({@code setTopicShardingIDLong(long)} -> {@link Long},
 * {@code setTopicShardingIDString(String)} -> {@link String}).
 *
 * <p>Input, one record per line (ASCII only, so no line can be split by the reader):
 * <pre>
 * N&lt;TAB&gt;1,2,3,7          partition counts, first line only
 * L&lt;TAB&gt;-42              a long key, in decimal
 * S&lt;TAB&gt;base64           a String key: base64 of its UTF-8 bytes
 * U&lt;TAB&gt;base64           a String key: base64 of its UTF-16BE code units, for strings
 *                          UTF-8 cannot carry (lone surrogates)
 * </pre>
 * Output, one line per key, in input order: {@code hash<TAB>p1,p2,...} (one partition per
 * count, in the order of the N line).
 */
public final class ShardingCompat {
    private ShardingCompat() {}

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8), 1 << 16);
        BufferedWriter out = new BufferedWriter(
                new OutputStreamWriter(System.out, StandardCharsets.UTF_8), 1 << 16);
        String header = in.readLine();
        if (header == null || !header.startsWith("N\t")) {
            fail("first line must be N<TAB>counts, got: " + header);
        }
        String[] fields = header.substring(2).split(",");
        int[] counts = new int[fields.length];
        for (int i = 0; i < fields.length; i++) {
            counts[i] = Integer.parseInt(fields[i]);
            if (counts[i] < 1) {
                fail("partition counts must be >= 1, got " + counts[i]);
            }
        }
        Base64.Decoder base64 = Base64.getDecoder();
        StringBuilder line = new StringBuilder();
        String record;
        int lineNo = 1;
        while ((record = in.readLine()) != null) {
            lineNo++;
            if (record.length() < 2 || record.charAt(1) != '\t') {
                fail("line " + lineNo + ": expected <kind><TAB><payload>");
            }
            String payload = record.substring(2);
            Object key;
            switch (record.charAt(0)) {
                case 'L':
                    key = Long.valueOf(Long.parseLong(payload));
                    break;
                case 'S':
                    key = new String(base64.decode(payload), StandardCharsets.UTF_8);
                    break;
                case 'U':
                    key = fromUtf16Units(base64.decode(payload));
                    break;
                default:
                    fail("line " + lineNo + ": unknown kind " + record.charAt(0));
                    return;
            }
            int hash = key.hashCode();
            line.setLength(0);
            line.append(hash).append('\t');
            for (int i = 0; i < counts.length; i++) {
                if (i > 0) {
                    line.append(',');
                }
                line.append(Math.abs(key.hashCode() % counts[i]));
            }
            out.write(line.toString());
            out.write('\n');
        }
        out.flush();
    }

    /** Builds the String code unit by code unit: a decoder would replace lone surrogates. */
    private static String fromUtf16Units(byte[] be) {
        if (be.length % 2 != 0) {
            fail("UTF-16BE payload has an odd number of bytes");
        }
        char[] units = new char[be.length / 2];
        for (int i = 0; i < units.length; i++) {
            units[i] = (char) (((be[2 * i] & 0xFF) << 8) | (be[2 * i + 1] & 0xFF));
        }
        return new String(units);
    }

    private static void fail(String message) {
        System.err.println("ShardingCompat: " + message);
        System.exit(2);
    }
}
